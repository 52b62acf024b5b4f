"""llmgw.admin_protocol: a known node's heartbeat answered inline, byte for byte as the ASGI way answers it.

Two servers of the same application run side by side: the admin listener's
protocol, and uvicorn's plain httptools protocol, which serves every request
as ASGI. The same raw requests, pipelined or one by one, good and hostile,
are sent to both; what comes back must be the same bytes (the Date header
aside). Other tests show the inline way was really taken where it should be,
and not where it must not be.
"""

from __future__ import annotations

import json
import re
import socket
from urllib.parse import urlsplit

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentapi.limits import HEARTBEAT_LIMIT
from inventory.writes.heartbeats import desk
from llmgw.admin_protocol import AdminHttpProtocol
from llmgw.bootstrap import issue_join_token
from tests.agentapi.agenthttp import flush, register
from tests.agentapi.reports import report
from tests.asgiserver import asgi_live_server, uvicorn_in_thread

pytestmark = pytest.mark.django_db(transaction=True)

PATH = b"/api/v1/agent/heartbeat"
_DATE = re.compile(rb"\r\ndate: [^\r]*")


@pytest.fixture
def credential(client):
    answer = register(client, issue_join_token(), report=report())
    assert answer.status_code == 201, answer.content
    token = answer.json()["credential"]
    desk.lookup(token)  # as the desk that took the registration knows it: the inline way's case
    desk.refresh_shards()
    return token


@pytest.fixture
def servers():
    """(inline, plain): the admin listener's protocol, and uvicorn's, on the same application."""
    with asgi_live_server(http=AdminHttpProtocol) as inline, asgi_live_server(http="httptools") as plain:
        yield urlsplit(inline).port, urlsplit(plain).port


@pytest.fixture
def inline_answers(monkeypatch):
    """How many requests the inline way answered."""
    taken = []
    answer = AdminHttpProtocol._answer

    def counted(beat):
        taken.append(beat)
        return answer(beat)

    monkeypatch.setattr(AdminHttpProtocol, "_answer", staticmethod(counted))
    return taken


def exchange(port: int, raw: bytes) -> bytes:
    """Send ``raw`` at once, then read until the server closes the connection (the last request asks it to)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(raw)
        return _DATE.sub(b"", read_until_closed(sock))


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    received = []
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        received.append(chunk)
    return b"".join(received)


def request(
    token: str,
    body: bytes,
    *,
    method: bytes = b"POST",
    target: bytes = PATH,
    version: bytes = b"HTTP/1.1",
    auth: tuple[bytes, ...] | None = None,
    framing: str = "length",
    extra: tuple[tuple[bytes, bytes], ...] = (),
    close: bool = False,
) -> bytes:
    """One request's bytes; ``framing``: length, chunked, none (no body at all), over (a length past the limit)."""
    lines = [method + b" " + target + b" " + version, b"host: control"]
    for value in (b"Bearer " + token.encode(),) if auth is None else auth:
        lines.append(b"authorization: " + value)
    lines += [name + b": " + value for name, value in extra]
    if framing == "length":
        lines.append(b"content-length: " + str(len(body)).encode())
        payload = body
    elif framing == "chunked":
        lines.append(b"transfer-encoding: chunked")
        half = len(body) // 2
        parts = [p for p in (body[:half], body[half:]) if p]
        payload = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"
    elif framing == "over":
        lines.append(b"content-length: " + str(HEARTBEAT_LIMIT + 1).encode())
        payload = b""
    else:
        payload = b""
    if close:
        lines.append(b"connection: close")
    return b"\r\n".join(lines) + b"\r\n\r\n" + payload


def both(servers, raw: bytes) -> tuple[bytes, bytes]:
    inline, plain = servers
    return exchange(inline, raw), exchange(plain, raw)


BEAT = json.dumps({"load": {"cpu_percent": 12.5, "load1": 0.8}, "shards": []}).encode()


def test_a_plain_beat_is_answered_inline_with_the_asgi_way_s_bytes(servers, credential, inline_answers):
    inline, plain = both(servers, request(credential, BEAT, close=True))
    assert inline_answers, "the inline way did not take a known node's plain beat"
    assert inline == plain
    assert inline.startswith(b"HTTP/1.1 200 OK\r\n")
    head, _, body = inline.partition(b"\r\n\r\n")
    assert json.loads(body) == {"shards": [], "send_report": False}
    assert b"content-type: application/json" in head
    flush()


def test_beats_one_after_another_on_a_kept_connection_are_all_answered_inline(servers, credential, inline_answers):
    beats = request(credential, BEAT) * 4 + request(credential, BEAT, close=True)
    inline, plain = both(servers, beats)
    assert len(inline_answers) == 5
    assert inline == plain
    assert inline.count(b"HTTP/1.1 200 OK") == 5
    flush()


def test_a_beat_behind_a_request_still_being_answered_waits_its_turn(servers, credential, inline_answers):
    """Pipelined behind a Django request, the beat goes the ASGI way, so the answers keep the requests' order."""
    ahead = b"GET /api/v1/agent/heartbeat?x=1 HTTP/1.1\r\nhost: control\r\n\r\n"
    slow = b"POST /api/v1/agent/report HTTP/1.1\r\nhost: control\r\ncontent-length: 2\r\n\r\n{}"
    inline, plain = both(servers, slow + ahead + request(credential, BEAT, close=True))
    assert inline == plain
    statuses = re.findall(rb"HTTP/1.1 (\d+)", inline)
    assert statuses == [b"401", b"405", b"200"]
    flush()


@pytest.mark.parametrize(
    "raw_for",
    [
        pytest.param(lambda t: request("not-a-credential", BEAT, close=True), id="unknown credential"),
        pytest.param(lambda t: request(t, BEAT, auth=(b"Basic " + t.encode(),), close=True), id="not bearer"),
        pytest.param(lambda t: request(t, BEAT, auth=(), close=True), id="no authorization"),
        pytest.param(lambda t: request(t, BEAT, framing="chunked", close=True), id="chunked"),
        pytest.param(lambda t: request(t, b"", framing="over", close=True), id="over the limit"),
        pytest.param(lambda t: request(t, BEAT, target=PATH + b"?a=1", close=True), id="a query"),
        pytest.param(lambda t: request(t, BEAT, method=b"PUT", close=True), id="not POST"),
        pytest.param(
            lambda t: request(t, BEAT, extra=((b"expect", b"100-continue"),), close=True), id="expect 100-continue"
        ),
    ],
)
def test_what_the_inline_way_leaves_alone_goes_the_asgi_way(servers, credential, inline_answers, raw_for):
    inline, plain = both(servers, raw_for(credential))
    assert not inline_answers
    assert inline == plain
    flush()


@pytest.mark.parametrize(
    "body",
    [b"{", b"[]", b"null", b"", b'{"load": "hot"}', b'{"load": {"cpu_percent": NaN}}', b"\xff\xfe", b"[" * 200],
)
def test_a_refused_beat_reads_the_same_either_way(servers, credential, inline_answers, body):
    inline, plain = both(servers, request(credential, body, close=True))
    assert inline_answers
    assert inline == plain
    assert inline.startswith(b"HTTP/1.1 400 Bad Request\r\n")
    assert json.loads(inline.partition(b"\r\n\r\n")[2])["error"]


def test_an_http_1_0_beat_is_answered_inline_and_its_connection_closed(servers, credential, inline_answers):
    inline, plain = both(servers, request(credential, BEAT, version=b"HTTP/1.0"))
    assert inline_answers
    assert inline == plain
    assert b"\r\nconnection: close\r\n" in inline
    flush()


def test_a_failure_inside_the_inline_answer_is_a_500_not_a_parse_error(servers, credential, monkeypatch, caplog):
    def broken(beat):
        raise RuntimeError("a bug")

    monkeypatch.setattr(AdminHttpProtocol, "_answer", staticmethod(broken))
    inline, _ = both(servers, request(credential, BEAT))
    assert inline.startswith(b"HTTP/1.1 500 Internal Server Error\r\n")
    assert inline.endswith(b"\r\n\r\nInternal Server Error")
    assert b"\r\nconnection: close\r\n" in inline
    assert "the heartbeat's inline answer failed" in caplog.text


def test_a_client_that_pipelines_beats_and_never_reads_its_answers_is_not_buffered_without_end(credential):
    """Once the answers back up, the beats go the ASGI way, which stops reading: the server holds a bounded amount."""
    beats = request(credential, BEAT) * 5000  # about a megabyte
    sent = 0
    with (
        uvicorn_in_thread() as (server, url),
        socket.create_connection(("127.0.0.1", urlsplit(url).port), timeout=3) as sock,
    ):
        try:
            while sent < 200 * len(beats):
                sock.sendall(beats)
                sent += len(beats)
        except TimeoutError:
            pass  # the server stopped reading
        held = max(p.transport.get_write_buffer_size() for p in server.server_state.connections)
    assert sent < 200 * len(beats), "the server read every beat while its answers went unread"
    assert held < 2 * 1024 * 1024, f"{held} bytes of answers held for a client that reads none"
    desk.pending.clear()


json_leaf = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=12)
)
json_value = st.recursive(
    json_leaf, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
)
beat_bodies = (
    st.fixed_dictionaries(
        {},
        optional={
            "load": json_value,
            "shards": json_value,
            "report_digest": json_value,
            "collected": json_value,
            "prefetch": json_value,
        },
    ).map(lambda d: json.dumps(d).encode())
    | st.binary(max_size=40)
    | st.just(BEAT)
)
credentials = st.sampled_from(["good", "unknown", "none", "basic", "two"])


@st.composite
def pipelines(draw):
    """One to three requests, the last asking to close; one whose length runs past the limit only last."""
    count = draw(st.integers(1, 3))
    out = []
    for i in range(count):
        last = i == count - 1
        framing = draw(st.sampled_from(["length", "length", "length", "chunked", "none"] + (["over"] if last else [])))
        out.append(
            {
                "body": draw(beat_bodies),
                "framing": framing,
                "credential": draw(credentials),
                "method": draw(st.sampled_from([b"POST", b"POST", b"POST", b"GET"])),
                "target": draw(st.sampled_from([PATH, PATH, PATH, PATH + b"?x", b"/api/v1/agent/heartbea%74"])),
                "version": draw(st.sampled_from([b"HTTP/1.1", b"HTTP/1.1", b"HTTP/1.0"])),
                "close": last or draw(st.booleans()),
            }
        )
    return out


def _auth(kind: str, token: str) -> tuple[bytes, ...]:
    return {
        "good": (b"Bearer " + token.encode(),),
        "unknown": (b"Bearer nope",),
        "none": (),
        "basic": (b"Basic " + token.encode(),),
        "two": (b"Bearer " + token.encode(), b"Bearer nope"),
    }[kind]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pipeline=pipelines())
def test_any_pipeline_of_requests_is_answered_the_same_either_way(servers, credential, pipeline):
    raw = b"".join(
        request(
            credential,
            r["body"],
            method=r["method"],
            target=r["target"],
            version=r["version"],
            auth=_auth(r["credential"], credential),
            framing=r["framing"],
            close=r["close"],
        )
        for r in pipeline
    )
    inline, plain = both(servers, raw)
    assert inline == plain
    desk.pending.clear()
