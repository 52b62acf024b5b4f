"""Server-sent events as engines send them: cut into whole events, their data read. Pure: no Django, no I/O."""

from __future__ import annotations

import json


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


DONE = b"[DONE]"
"""What ``chat_events`` yields for the chat stream's last event."""


def chat_events(buffer: bytearray) -> list[dict | bytes]:
    """The complete chat-completions events at the front of ``buffer``, each parsed: a dict, or ``DONE``.

    Events without data, and data that is not a JSON object, are skipped: a
    translator passes on what it understands and nothing it cannot read.
    """
    events: list[dict | bytes] = []
    for raw in split(buffer):
        payload = data(raw)
        if payload is None:
            continue
        if payload == DONE:
            events.append(DONE)
            continue
        try:
            obj = json.loads(payload)
        except ValueError:
            continue
        if isinstance(obj, dict):
            events.append(obj)
    return events
