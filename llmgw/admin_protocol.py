"""The admin listener's HTTP protocol: uvicorn's httptools protocol, with a known node's heartbeat answered inline.

A heartbeat is most of what the admin listener hears: at 10,000 nodes,
1,833 a second against one full report in twelve (bench/scale.py). Served
as ASGI, each beat paid for what a request needs in general and a beat does
not: a task of its own, the scope and event dicts, the listener router and
Channels' protocol router, and two writes to the socket, the head and then
the body. Here the beat is answered inside the parser's callbacks, in one
write, when the request is the plain case:

- ``POST /api/v1/agent/heartbeat`` exactly (no query, no escapes);
- a ``Content-Length`` within the heartbeat's limit, and no
  ``Transfer-Encoding`` or ``Expect``;
- a bearer credential this process knows and holds fresh
  (``desk.cached``: no database lookup is needed);
- no earlier request of the connection still being answered, so the
  answers keep the requests' order;
- a client that reads its answers: once the socket's write buffer is past
  its high-water mark, beats go the ASGI way, whose answer waits for the
  buffer to drain and whose pipelined requests stop the reading, so a
  client that pipelines beats and never reads cannot make this process
  buffer answers without end.

Anything else, and every other path, is served as before through
``llmgw.asgi`` (agentapi.fast.heartbeat), which answers the same request
with the same bytes: tests/core/test_admin_protocol.py sends both servers
the same requests and compares what comes back. What a beat is answered is
decided in one place for both (agentapi.fast.checked_beat,
inventory.writes.heartbeats.take); only the framing is here.

The lane obeys the listener's limits as the ASGI way does
(llmgw.listener_protocol): a beat's head is counted and timed before the
lane sees it, its body is held to the body's deadline, and a connection
past the process's cap gets the 503, not an inline answer.

This leans on uvicorn's protocol's attributes (``cycle``, ``pipeline``,
``headers``, ``url``, the keep-alive timer), which are not public API: the
tests above run against the uvicorn pyproject.toml allows, and a change
there fails them rather than this lane.
"""

from __future__ import annotations

import logging

from agentapi import fast
from agentapi.limits import HEARTBEAT_LIMIT
from core import jsontext
from core.credentials import bearer_secret
from inventory.writes import heartbeats
from inventory.writes.heartbeats import desk
from llmgw.listener_protocol import BoundedHttpProtocol

log = logging.getLogger(__name__)

_PATH = fast.PATH.encode()
_INTERNAL_ERROR = b"Internal Server Error"


class _Beat:
    """A heartbeat being received inline: its node, its body so far, and whether the connection stays open."""

    __slots__ = ("body", "keep_alive", "ref")

    def __init__(self, ref: heartbeats.NodeRef, keep_alive: bool) -> None:
        self.ref = ref
        self.body = bytearray()
        self.keep_alive = keep_alive


class AdminHttpProtocol(BoundedHttpProtocol):
    """The listeners' bounded protocol for the admin listener; a known node's plain heartbeat never becomes an ASGI
    request."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.beat: _Beat | None = None

    def on_message_begin(self) -> None:
        self.beat = None
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        beat = None if self.over_capacity else self._inline_beat()
        if beat is None:
            super().on_headers_complete()
        else:
            self.head_received()
            self.beat = beat

    def _inline_beat(self) -> _Beat | None:
        """The beat to answer inline, or None: the request goes the ASGI way (see the module's list)."""
        if self.url != _PATH or self.parser.get_method() != b"POST" or self.expect_100_continue:
            return None
        answering = self.cycle is not None and not self.cycle.response_complete
        if answering or self.pipeline or self.flow.write_paused or self.parser.should_upgrade():
            return None
        length = authorization = None
        for name, value in self.headers:
            if name == b"content-length":
                if length is not None:
                    return None
                length = value
            elif name == b"authorization":
                if authorization is None:  # the first, as agentapi.fast.header reads it
                    authorization = value
            elif name == b"transfer-encoding":
                return None
        if length is None or not length.isdigit() or int(length) > HEARTBEAT_LIMIT or authorization is None:
            return None
        secret = bearer_secret(authorization.decode("latin-1"))
        ref = None if secret is None else desk.cached(secret)
        if ref is None:
            return None  # a lookup, a 401: the ASGI way has the words and the thread for them
        keep_alive = self.parser.get_http_version() != "1.0" and self.parser.should_keep_alive()
        return _Beat(ref, keep_alive)

    def on_body(self, body: bytes) -> None:
        if self.beat is None:
            return super().on_body(body)
        # The parser hands over no more than the Content-Length, which was checked against the limit.
        self.beat.body += body

    def on_message_complete(self) -> None:
        beat, self.beat = self.beat, None
        if beat is None:
            return super().on_message_complete()
        self.message_received()
        try:
            status, answer = self._answer(beat)
        except Exception:
            # As uvicorn answers an application that raised; the parser's callback must not raise
            # (uvicorn would call it an invalid request).
            log.exception("the heartbeat's inline answer failed")
            self._write(500, _INTERNAL_ERROR, b"text/plain; charset=utf-8", keep_alive=False)
            return
        self._write(status, jsontext.compact(answer), b"application/json", beat.keep_alive)

    @staticmethod
    def _answer(beat: _Beat) -> tuple[int, dict]:
        parsed, refused = fast.checked_beat(bytes(beat.body))
        if refused:
            return 400, {"error": refused}
        return 200, heartbeats.take(beat.ref, parsed)

    def _write(self, status: int, body: bytes, content_type: bytes, keep_alive: bool) -> None:
        """The whole answer in one write, with the headers uvicorn would have sent; then as after any answer."""
        self.write_whole(status, body, content_type, keep_alive=keep_alive)
        if keep_alive:
            self.on_response_complete()  # counts it, and arms the keep-alive timer
        else:
            self.server_state.total_requests += 1
            self.transport.close()

    def shutdown(self) -> None:
        """As uvicorn's, except that a beat half received is answered first, then the connection closed."""
        if self.beat is not None:
            self.beat.keep_alive = False
        else:
            super().shutdown()
