"""A lean HTTP/1.1 load generator for the benchmarks: pre-encoded requests over keep-alive sockets.

httpx costs about a millisecond of CPU per request in Python; on the 2-core
machines the benchmarks run on, a client that heavy would measure itself
rather than the server. This one writes bytes it built once and reads just
enough of the answer to find its end.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass


def encode_post(host: str, path: str, token: str, body: bytes) -> bytes:
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


@dataclass
class Answer:
    status: int
    seconds: float
    body: bytes = b""


class Connection:
    """One keep-alive connection; requests on it go one at a time."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)

    def close(self) -> None:
        """Close the socket; the next request opens another."""
        if self.writer is not None:
            self.writer.close()
            self.writer = None

    async def send(self, request: bytes) -> Answer:
        if self.writer is None or self.writer.is_closing():
            await self.open()
        started = time.perf_counter()
        self.writer.write(request)
        status_line = await self.reader.readline()
        if not status_line:
            self.writer = None
            raise ConnectionError("the server closed the connection")
        status = int(status_line.split()[1])
        length, close, chunked = 0, False, False
        while True:
            line = await self.reader.readline()
            if line in (b"\r\n", b""):
                break
            name, _, value = line.decode("latin-1").partition(":")
            if name.lower() == "content-length":
                length = int(value)
            elif name.lower() == "transfer-encoding" and "chunked" in value.lower():
                chunked = True
            elif name.lower() == "connection" and "close" in value.lower():
                close = True
        body = b""
        if chunked:
            await self._skip_chunks()
        elif length:
            body = await self.reader.readexactly(length)

        if close:
            self.writer.close()
            self.writer = None
        return Answer(status, time.perf_counter() - started, body)

    async def _skip_chunks(self) -> None:
        """Read a chunked body to its end (Django's answers come chunked when they carry no length)."""
        while True:
            size = int((await self.reader.readline()).split(b";")[0].strip() or b"0", 16)
            await self.reader.readexactly(size + 2)  # the chunk and its CRLF
            if size == 0:
                return


@dataclass
class FleetRun:
    """What :func:`drive_fleet` saw: per kind ("heartbeat", "report"), each answer's seconds behind its due time."""

    samples: dict[str, list[float]]
    errors: dict[str, int]
    elapsed: float


async def drive_fleet(
    host: str,
    port: int,
    beats: list[bytes],
    reports: list[bytes],
    *,
    heartbeat_s: float,
    report_s: float,
    seconds: float,
    connections: int,
    drain_s: float = 120.0,
) -> FleetRun:
    """Each node beats every ``heartbeat_s`` and sends its full report every ``report_s``, spread evenly.

    A node sends its report in place of a heartbeat once every report
    interval, the nodes taking turns so that the reports are spread too.
    Latency counts from when a request was due: time spent waiting for a free
    connection is time the server is behind. What is still queued
    ``drain_s`` after the schedule ends is counted under ``unanswered``.
    """
    samples: dict[str, list[float]] = {"heartbeat": [], "report": []}
    errors: dict[str, int] = {}
    queue: asyncio.Queue = asyncio.Queue()
    n, every = len(beats), max(1, round(report_s / heartbeat_s))
    stop_at = time.monotonic() + seconds

    async def schedule() -> None:
        t0, tick = time.monotonic(), 0
        while time.monotonic() < stop_at:
            due = t0 + tick * heartbeat_s / n
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            i, cycle = tick % n, tick // n
            if (i + cycle) % every == 0:
                queue.put_nowait(("report", reports[i], due))
            else:
                queue.put_nowait(("heartbeat", beats[i], due))
            tick += 1

    async def worker() -> None:
        conn = Connection(host, port)
        while True:
            kind, request, due = await queue.get()
            try:
                answer = await conn.send(request)
                if answer.status != 200:
                    errors[kind] = errors.get(kind, 0) + 1
                samples[kind].append(time.monotonic() - due)
            except (ConnectionError, OSError, asyncio.IncompleteReadError):
                errors[kind] = errors.get(kind, 0) + 1
                conn = Connection(host, port)
            queue.task_done()

    t0 = time.monotonic()
    workers = [asyncio.create_task(worker()) for _ in range(connections)]
    await schedule()
    try:
        await asyncio.wait_for(queue.join(), timeout=drain_s)
    except TimeoutError:
        errors["unanswered"] = queue.qsize()
    elapsed = time.monotonic() - t0
    for task in workers:
        task.cancel()
    return FleetRun(samples, errors, elapsed)


async def drive_fleet_as_told(admin: str, beats: list[bytes], reports: list[bytes], args, seconds: float) -> FleetRun:
    """:func:`drive_fleet` against ``admin`` (host:port) for ``seconds``, at the command line's
    ``--heartbeat``, ``--report`` and ``--connections``."""
    host, port = admin.rsplit(":", 1)
    return await drive_fleet(
        host,
        int(port),
        beats,
        reports,
        heartbeat_s=args.heartbeat,
        report_s=args.report,
        seconds=seconds,
        connections=args.connections,
    )
