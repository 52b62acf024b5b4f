"""The engine client's HTTP/1.1: bodies by length, chunked and to the close, however the bytes are cut up."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway import upstream
from gateway.upstream import UpstreamError, _unchunk


def chunked(*parts: bytes, trailer: bytes = b"") -> bytes:
    body = b"".join(
        b"%x;ext=1\r\n%s\r\n" % (len(p), p) if i % 2 else b"%x\r\n%s\r\n" % (len(p), p) for i, p in enumerate(parts)
    )
    return body + b"0\r\n" + trailer + b"\r\n"


@given(
    parts=st.lists(st.binary(min_size=1, max_size=300), max_size=8),
    cuts=st.lists(st.integers(min_value=0, max_value=4000), max_size=12),
    trailer=st.sampled_from([b"", b"x-checksum: 1\r\n"]),
)
@settings(max_examples=300, deadline=None)
def test_chunks_come_out_whole_wherever_the_reads_cut_them(parts, cuts, trailer):
    wire = chunked(*parts, trailer=trailer)
    buffer, out, finished = bytearray(), bytearray(), False
    edges = sorted({c % (len(wire) + 1) for c in cuts} | {len(wire)})
    start = 0
    for edge in edges:
        buffer += wire[start:edge]
        start = edge
        piece, finished = _unchunk(buffer)
        out += piece
        if finished:
            break
    assert finished and bytes(out) == b"".join(parts) and buffer == b""


@pytest.mark.parametrize(
    ("wire", "words"),
    [
        (b"zz\r\nhello\r\n", "bad chunk size"),
        (b"5\r\nhelloXX0\r\n\r\n", "did not end where its size said"),
        (b"-5\r\nhello\r\n", "negative chunk size"),
    ],
)
def test_broken_chunking_is_an_upstream_error_that_says_what(wire, words):
    with pytest.raises(UpstreamError, match=words):
        _unchunk(bytearray(wire))


async def engine(answers: list[list[bytes]], pause_s: float = 0.0):
    """A raw server: for each request on a connection, the next answer, written in the pieces given."""
    queue = list(answers)

    async def handle(reader, writer):
        try:
            while queue:
                await reader.readuntil(b"\r\n\r\n")  # the request's body, "{}", is never read: nothing needs it
                for piece in queue.pop(0):
                    if piece == b"<close>":
                        writer.close()
                        return
                    writer.write(piece)
                    await writer.drain()
                    await asyncio.sleep(pause_s)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1/chat/completions"


def run(scenario):
    return asyncio.run(scenario())


def test_a_chunked_stream_is_passed_on_and_the_connection_kept_for_the_next_request():
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    events = [b"data: %d\n\n" % i for i in range(5)]
    wire = chunked(*events)

    async def scenario():
        server, url = await engine(
            [[head, wire[:7], wire[7:40], wire[40:]], [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"]]
        )
        client = upstream.Client(connect_timeout_s=1, read_timeout_s=5)
        async with server:
            first = await client.post(url, b"{}")
            pieces = [p async for p in first.stream()]
            await first.close()
            second = await client.post(url, b"{}")
            return pieces, second.reused, await second.read()

    pieces, reused, body = run(scenario)
    assert b"".join(pieces) == b"".join(events)
    assert reused and body == b"ok"


def test_an_answer_read_to_the_close_and_one_cut_short():
    async def scenario():
        server, url = await engine([[b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n", b"all of it", b"<close>"]])
        short, short_url = await engine([[b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nhalf", b"<close>"]])
        client = upstream.Client(connect_timeout_s=1, read_timeout_s=5)
        async with server, short:
            whole = await (await client.post(url, b"{}")).read()
            with pytest.raises(UpstreamError, match="closed the connection mid-answer"):
                await (await client.post(short_url, b"{}")).read()
        return whole

    assert run(scenario) == b"all of it"


def test_an_engine_that_goes_silent_mid_stream_times_out_but_a_slow_reader_does_not():
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"

    async def scenario():
        silent, silent_url = await engine([[head, b"5\r\nhello\r\n"]])
        steady, steady_url = await engine([[head, b"5\r\nhello\r\n", b"5\r\nworld\r\n", b"0\r\n\r\n"]], pause_s=0.2)
        client = upstream.Client(connect_timeout_s=1, read_timeout_s=1.0)
        async with silent, steady:
            got = []
            with pytest.raises(UpstreamError, match="sent nothing for 1s"):
                async for piece in (await client.post(silent_url, b"{}")).stream():
                    got.append(piece)
            slow = []
            async for piece in (await client.post(steady_url, b"{}")).stream():
                slow.append(piece)
                await asyncio.sleep(1.5)  # the consumer's own time is not the engine's silence
        return got, slow

    got, slow = run(scenario)
    assert got == [b"hello"]
    assert b"".join(slow) == b"helloworld"


def test_extra_headers_go_with_the_request_and_one_with_a_line_break_is_left_out():
    heads = []

    async def scenario():
        async def handle(reader, writer):
            heads.append((await reader.readuntil(b"\r\n\r\n")).decode())
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
            await writer.drain()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1/chat/completions"
        client = upstream.Client(connect_timeout_s=1, read_timeout_s=5)
        async with server:
            extra = {
                "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                "x-bad": "a\r\nx-evil: 1",
            }
            answer = await client.post(url, b"{}", headers=extra)
            return await answer.read()

    assert run(scenario) == b"ok"
    (head,) = heads
    assert "\r\ntraceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\r\n" in head
    assert "x-evil" not in head and "x-bad" not in head
