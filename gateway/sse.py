"""Server-sent events as engines send them: cut into whole events, their data read. Pure: no Django, no I/O."""

from __future__ import annotations


def split(buffer: bytearray) -> list[bytes]:
    """Take every complete event off the front of ``buffer`` (LF or CRLF framed); what is left is incomplete."""
    events = []
    while True:
        lf, crlf = buffer.find(b"\n\n"), buffer.find(b"\r\n\r\n")
        if crlf != -1 and (lf == -1 or crlf < lf):
            end, after = crlf, crlf + 4
        elif lf != -1:
            end, after = lf, lf + 2
        else:
            return events
        events.append(bytes(buffer[:end]))
        del buffer[:after]


def data(raw: bytes) -> bytes | None:
    """The ``data:`` of one event (its lines joined); None when it has none."""
    lines = [line[5:].strip() for line in raw.splitlines() if line.startswith(b"data:")]
    return b"\n".join(lines) if lines else None
