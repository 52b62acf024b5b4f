"""Both listeners bound what one connection may hold or take (core.config.ListenerLimits, llmgw.listener_protocol).

A client that never finishes its head, drips a body, sends a head of
64 MB, opens connections without end or keeps one idle is closed or
refused, on the admin listener and the gateway's alike. These run against
``llmgw serve`` (embedded, no worker) with small limits, over real sockets;
the process serving each listener is measured in /proc. The heartbeat's
inline lane (llmgw.admin_protocol), which answers outside uvicorn's own
request handling, is held to the same limits with a spy on a server in a
thread.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core import config
from core.config import ConfigError, ListenerLimits
from llmgw.admin_protocol import AdminHttpProtocol
from llmgw.listener_protocol import FD_RESERVE, BoundedHttpProtocol, connection_cap, serving
from tests.asgiserver import uvicorn_in_thread
from tests.core import test_admin_protocol as beats
from tests.core.test_serve import Server, descendants, rss_kb

pytestmark = pytest.mark.slow
BEAT = beats.BEAT
credential = beats.credential  # a registered node the inline lane knows: the fixture, shared
inline_answers = beats.inline_answers
read_until_closed = beats.read_until_closed

HEAD_BYTES = 8192
HEAD_S = 1.5
BODY_S = 1.5
KEEP_ALIVE_S = 1.0
CONNECTIONS = 6
SLACK_S = 1.5
"""What a deadline may be late by on this shared two-core machine: the loop's timers, the test's own reads."""
LIMITS = {
    "LLMGW_LISTENER_HEAD_BYTES": str(HEAD_BYTES),
    "LLMGW_LISTENER_HEAD_TIMEOUT_S": str(HEAD_S),
    "LLMGW_LISTENER_BODY_TIMEOUT_S": str(BODY_S),
    "LLMGW_LISTENER_KEEP_ALIVE_S": str(KEEP_ALIVE_S),
    "LLMGW_LISTENER_CONNECTIONS": str(CONNECTIONS),
}


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Iterator[Server]:
    server = Server(tmp_path_factory.mktemp("limits"), "--no-worker", **LIMITS)
    try:
        server.wait_ready()
        yield server
        assert server.stop() == 0, server.log.read_text()
        assert "Traceback" not in server.log.read_text(), server.log.read_text()
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
            server.proc.wait()


class Listener:
    """One listener of ``llmgw serve``: where it is, which process serves it, and a request it answers."""

    def __init__(self, name: str, addr: str, pid: int, partial_body_target: bytes) -> None:
        self.name = name
        host, port = addr.rsplit(":", 1)
        self.addr = (host, int(port))
        self.pid = pid
        self.partial_body_target = partial_body_target

    def connect(self) -> socket.socket:
        sock = socket.create_connection(self.addr, timeout=30)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock


def gateway_pid(server: Server) -> int:
    (pid,) = [p for p in descendants(server.proc.pid) if b"llmgw.gateway_server" in cmdline(p)]
    return pid


def cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


@pytest.fixture(params=["admin", "gateway"])
def listener(request, served) -> Listener:
    if request.param == "admin":
        # Embedded, with one admin process: llmgw serve serves the admin listener itself.
        return Listener("admin", served.admin, served.proc.pid, b"/api/v1/agent/register")
    return Listener("gateway", served.gateway, gateway_pid(served), b"/v1/chat/completions")


HEALTHZ = b"GET /healthz HTTP/1.1\r\nhost: control\r\n\r\n"


def read_answer(sock: socket.socket) -> bytes:
    """One answer's bytes (head and a Content-Length body), or what came before the server closed."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        (int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")),
        0,
    )
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


def status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else 0


def error_sentence(listener: Listener, answer: bytes) -> str:
    """The refusal's sentence, in the listener's error shape: the gateway's OpenAI shape, the admin's own."""
    body = json.loads(answer.partition(b"\r\n\r\n")[2])
    return body["error"]["message"] if listener.name == "gateway" else body["error"]


# --- the head's size ------------------------------------------------------------------


def test_a_64_mb_head_is_refused_with_431_and_the_process_does_not_grow(listener):
    """The reported attack: a 196 MB header grew the admin process by 393 MB and the gateway's by 312, kept after
    the close. llhttp buffers a header until it ends, so the head is counted as it arrives, before the parser."""
    before = rss_kb(listener.pid)
    with listener.connect() as sock:
        sent = 0
        header = b"GET /healthz HTTP/1.1\r\nhost: control\r\nx-big: "
        chunk = b"a" * (1 << 20)
        try:
            sock.sendall(header)
            while sent < 64 << 20:
                sock.sendall(chunk)
                sent += len(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused midway: what is read next says how
        answer = read_until_closed(sock)
    grown = rss_kb(listener.pid) - before
    assert status(answer) == 431, answer[:300]
    assert "LLMGW_LISTENER_HEAD_BYTES" in error_sentence(listener, answer)
    assert sent < 64 << 20, "the whole 64 MB was taken"
    assert grown < 4096, f"the {listener.name} process grew by {grown} kB"


def head_of(size: int) -> bytes:
    """A request head of exactly ``size`` bytes, the padding in one header."""
    start, end = b"GET /healthz HTTP/1.1\r\nhost: control\r\nx-pad: ", b"\r\n\r\n"
    return start + b"p" * (size - len(start) - len(end)) + end


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    size=st.one_of(st.integers(200, HEAD_BYTES), st.integers(HEAD_BYTES + 1, 4 * HEAD_BYTES)),
    cuts=st.lists(st.floats(0, 1), max_size=4),
)
def test_a_head_is_refused_exactly_when_it_is_over_the_limit_however_it_is_split(listener, size, cuts):
    """Whatever writes the head comes in, one or several, a head within the limit is answered and one over it
    is a 431: the count is of the head's bytes, not of the reads that carried them."""
    raw = head_of(size)
    points = sorted({int(c * len(raw)) for c in cuts} | {0, len(raw)})
    with listener.connect() as sock:
        try:
            for a, b in itertools.pairwise(points):
                sock.sendall(raw[a:b])
                time.sleep(0.005)
        except (BrokenPipeError, ConnectionResetError):
            pass
        answer = read_answer(sock)
    assert status(answer) == (200 if size <= HEAD_BYTES else 431), (size, answer[:200])


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sizes=st.lists(st.integers(200, HEAD_BYTES), min_size=2, max_size=12))
def test_requests_pipelined_in_one_write_are_each_held_to_the_limit_not_all_together(listener, sizes):
    """Heads within the limit, sent back to back in one write of more than the limit in all: each is answered."""
    raw = b"".join(head_of(size) for size in sizes[:-1])
    last = head_of(sizes[-1])
    raw += last.replace(b"host: control\r\n", b"host: control\r\nconnection: close\r\n").replace(b"p" * 19, b"", 1)
    with listener.connect() as sock:
        sock.sendall(raw)
        answers = read_until_closed(sock)
    assert answers.count(b"HTTP/1.1 200 OK") == len(sizes), answers[:300]


# --- the time to send a head and a body ----------------------------------------------


def time_to_close(sock: socket.socket) -> tuple[float, bytes]:
    began = time.monotonic()
    answer = read_until_closed(sock)
    return time.monotonic() - began, answer


def test_a_connection_that_never_sends_is_closed_at_the_head_deadline_without_an_answer(listener):
    with listener.connect() as sock:
        took, answer = time_to_close(sock)
    assert answer == b"", "nothing was asked: nothing is answered"
    assert HEAD_S - 0.2 <= took <= HEAD_S + SLACK_S, took


@pytest.mark.parametrize("drip", [False, True], ids=["stalled", "dripped"])
def test_a_head_not_finished_in_time_is_a_408_and_closed(listener, drip):
    """Stalled halfway, or dripped a byte at a time (each byte well within any idle timeout): the deadline is for
    the whole head, so neither holds the connection past it."""
    partial = b"GET /healthz HTTP/1.1\r\nhost: control\r\nx-slow: "
    with listener.connect() as sock:
        began = time.monotonic()
        sock.sendall(partial)
        if drip:
            closed = threading.Event()

            def dripping() -> None:
                while not closed.is_set():
                    try:
                        sock.send(b"a")
                    except OSError:
                        return
                    closed.wait(0.2)

            threading.Thread(target=dripping, daemon=True).start()
        answer = read_until_closed(sock)
        took = time.monotonic() - began
        if drip:
            closed.set()
    assert status(answer) == 408, answer
    assert "LLMGW_LISTENER_HEAD_TIMEOUT_S" in error_sentence(listener, answer)
    assert HEAD_S - 0.2 <= took <= HEAD_S + SLACK_S, took


def test_a_body_not_finished_in_time_is_a_408_and_closed(listener):
    """A head that promises 1,000 bytes and sends 10: the application waits on the rest, the listener does not."""
    head = b"POST " + listener.partial_body_target + b" HTTP/1.1\r\nhost: control\r\ncontent-type: application/json\r\n"
    with listener.connect() as sock:
        sock.sendall(head + b"content-length: 1000\r\n\r\n" + b'{"model": ')
        took, answer = time_to_close(sock)
    assert status(answer) == 408, answer
    assert "LLMGW_LISTENER_BODY_TIMEOUT_S" in error_sentence(listener, answer)
    assert BODY_S - 0.2 <= took <= BODY_S + SLACK_S, took


# --- connections: how many, and how long one idles ------------------------------------


def test_past_the_connection_cap_a_request_is_a_503_and_a_freed_place_is_taken_again(listener):
    held = [listener.connect() for _ in range(CONNECTIONS)]
    try:
        # Held without a request, as a client that opens and waits does: each counts from its accept.
        with listener.connect() as extra:
            extra.sendall(HEALTHZ)
            answer = read_until_closed(extra)
        assert status(answer) == 503, answer
        assert b"retry-after: 1" in answer.lower()
        assert "LLMGW_LISTENER_CONNECTIONS" in error_sentence(listener, answer)
    finally:
        for sock in held:
            sock.close()
    # The server hears the closes in its own time; then the place is free again.
    deadline = time.monotonic() + 5
    while True:
        with listener.connect() as sock:
            sock.sendall(HEALTHZ)
            answered = status(read_answer(sock))
        if answered == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert answered == 200


def test_a_kept_connection_is_served_again_within_the_idle_limit_and_closed_past_it(listener):
    with listener.connect() as sock:
        sock.sendall(HEALTHZ)
        assert status(read_answer(sock)) == 200
        time.sleep(KEEP_ALIVE_S / 3)
        sock.sendall(HEALTHZ)
        assert status(read_answer(sock)) == 200
        took, answer = time_to_close(sock)
    assert answer == b""
    assert KEEP_ALIVE_S - 0.2 <= took <= KEEP_ALIVE_S + SLACK_S, took


# --- the heartbeat's inline lane, and what the deadlines leave alone (servers in a thread) ---

TIGHT = ListenerLimits(head_bytes=HEAD_BYTES, head_timeout_s=0.5, body_timeout_s=0.5, keep_alive_s=0.5, connections=3)


@pytest.fixture
def inline_taken(monkeypatch) -> list:
    """The beats the inline lane took on, answered or not."""
    taken = []
    decide = AdminHttpProtocol._inline_beat

    def counted(self):
        beat = decide(self)
        if beat is not None:
            taken.append(beat)
        return beat

    monkeypatch.setattr(AdminHttpProtocol, "_inline_beat", counted)
    return taken


@pytest.fixture
def admin_port() -> Iterator[int]:
    with uvicorn_in_thread(http=serving(AdminHttpProtocol, TIGHT)) as (_, url):
        yield urlsplit(url).port


@pytest.mark.django_db(transaction=True)
def test_a_beat_taken_inline_whose_body_stops_is_a_408_at_the_body_deadline(admin_port, credential, inline_taken):
    raw = beats.request(credential, BEAT)
    with socket.create_connection(("127.0.0.1", admin_port), timeout=30) as sock:
        sock.sendall(raw[: raw.index(b"\r\n\r\n") + 4 + len(BEAT) // 2])
        took, answer = time_to_close(sock)
    assert inline_taken, "the inline lane did not take the beat"
    assert status(answer) == 408, answer
    assert "LLMGW_LISTENER_BODY_TIMEOUT_S" in json.loads(answer.partition(b"\r\n\r\n")[2])["error"]
    assert TIGHT.body_timeout_s - 0.2 <= took <= TIGHT.body_timeout_s + SLACK_S, took


@pytest.mark.django_db(transaction=True)
def test_past_the_connection_cap_a_known_node_s_beat_is_a_503_not_an_inline_answer(
    admin_port, credential, inline_answers
):
    with socket.create_connection(("127.0.0.1", admin_port), timeout=30) as sock:
        sock.sendall(beats.request(credential, BEAT))
        assert status(read_answer(sock)) == 200 and len(inline_answers) == 1, "the lane answers a beat in the cap"
    held = [socket.create_connection(("127.0.0.1", admin_port), timeout=30) for _ in range(TIGHT.connections)]
    try:
        with socket.create_connection(("127.0.0.1", admin_port), timeout=30) as sock:
            sock.sendall(beats.request(credential, BEAT))
            answer = read_until_closed(sock)
    finally:
        for sock in held:
            sock.close()
    assert status(answer) == 503, answer
    assert len(inline_answers) == 1


async def slow_app(scope, receive, send) -> None:
    """Takes three times the deadlines to answer, having read the body only after as long (a busy pool, say)."""
    if scope["type"] == "websocket":
        await receive()
        await send({"type": "websocket.accept"})
        while (message := await receive())["type"] == "websocket.receive":
            await send({"type": "websocket.send", "text": message["text"]})
        return
    await asyncio.sleep(3 * TIGHT.body_timeout_s)
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    await asyncio.sleep(3 * TIGHT.body_timeout_s)
    answer = b"took %d bytes" % len(body)
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(answer))]})
    await send({"type": "http.response.body", "body": answer})


@pytest.fixture
def slow_port() -> Iterator[int]:
    with uvicorn_in_thread(app=slow_app, http=serving(BoundedHttpProtocol, TIGHT)) as (_, url):
        yield urlsplit(url).port


def test_the_deadlines_do_not_count_the_time_the_listener_keeps_its_client_waiting(slow_port):
    """The listener answers slowly. A body larger than uvicorn buffers before it stops reading (64 kB), the
    client's next head, begun meanwhile, and its 100-continue body, sent when asked, are not the client's delay:
    answered, all of it, though each wait is several times the deadlines."""
    expecting = b"POST / HTTP/1.1\r\nhost: h\r\ncontent-length: 5\r\nexpect: 100-continue\r\n\r\n"
    large = b"x" * 200_000
    with socket.create_connection(("127.0.0.1", slow_port), timeout=30) as sock:
        sock.sendall(b"POST / HTTP/1.1\r\nhost: h\r\ncontent-length: 200000\r\n\r\n" + large + expecting[:20])
        assert read_answer(sock).endswith(b"took 200000 bytes")
        sock.sendall(expecting[20:])
        assert read_answer(sock) == b"HTTP/1.1 100 Continue\r\n\r\n"
        sock.sendall(b"hello")
        assert read_answer(sock).endswith(b"took 5 bytes")


def test_a_websocket_outlives_every_deadline(slow_port):
    """Upgraded, the connection is the websocket protocol's, with its own limits: no timer of the head's is left."""
    from websockets.sync.client import connect

    with connect(f"ws://127.0.0.1:{slow_port}/", open_timeout=10) as ws:
        time.sleep(2 * max(TIGHT.head_timeout_s, TIGHT.body_timeout_s, TIGHT.keep_alive_s))
        ws.send("still here")
        assert ws.recv(timeout=10) == "still here"


# --- the settings ---------------------------------------------------------------------


def test_the_limits_default_to_what_docs_say_and_read_the_environment():
    assert config.listener_limits({}) == ListenerLimits(
        head_bytes=32768, head_timeout_s=10.0, body_timeout_s=60.0, keep_alive_s=5.0, connections=16384
    )
    assert config.listener_limits(LIMITS) == ListenerLimits(HEAD_BYTES, HEAD_S, BODY_S, KEEP_ALIVE_S, CONNECTIONS)


@pytest.mark.parametrize(
    ("variable", "value", "said"),
    [
        ("LLMGW_LISTENER_HEAD_BYTES", "100", "not a whole number from 1024 to 1048576"),
        ("LLMGW_LISTENER_HEAD_TIMEOUT_S", "nan", "not a finite number"),
        ("LLMGW_LISTENER_BODY_TIMEOUT_S", "0", "outside 0.1..3600"),
        ("LLMGW_LISTENER_KEEP_ALIVE_S", "soon", "not a number"),
        ("LLMGW_LISTENER_CONNECTIONS", "0", "not a whole number from 1 to 1000000"),
    ],
)
def test_a_bad_limit_stops_llmgw_serve_naming_it(tmp_path, variable, value, said):
    with pytest.raises(ConfigError) as refused:
        config.load({"LLMGW_DATA_DIR": str(tmp_path), variable: value})
    assert refused.value.variable == variable and said in refused.value.reason


@given(configured=st.integers(1, 10**6), open_files=st.integers(-1, 10**6))
def test_the_connection_cap_never_passes_what_the_open_file_limit_leaves(configured, open_files):
    cap = connection_cap(configured, open_files)
    assert 1 <= cap <= configured
    if open_files >= 0:
        assert cap == configured or cap <= open_files - FD_RESERVE or cap == 1
    else:
        assert cap == configured
