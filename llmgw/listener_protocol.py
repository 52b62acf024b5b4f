"""Both listeners' HTTP protocol: uvicorn's httptools protocol, bounded in what one connection may hold or take.

uvicorn with httptools bounds none of it. llhttp buffers a header until the
header ends, whatever its length: one connection sending a 196 MB header grew
the admin process from 153 to 546 MB (kept after the close) and the
gateway's from 123 to 435 MB. Nothing timed a head or a body, so a partial
one, or a connection that sent nothing, stayed open as long as its client
liked; and any number of connections were served at once. Here, with the
limits of core.config.ListenerLimits (LLMGW_LISTENER_*):

- **the head's size**: its bytes are counted as they arrive, before the
  parser sees them; the first byte past the limit is never parsed, and the
  answer is a 431;
- **the time to send a head**, from the connection's opening or the
  request's first byte, and **a body**, from the head's end: one deadline
  for the whole of each, not an idle timeout that a byte now and then
  resets. Past it a partial request is a 408; a connection that sent
  nothing is closed without an answer (a browser's spare connection, say,
  which an answer would confuse). Time the listener itself holds the client
  up does not count: its reading paused (a request queued behind another
  being answered), a 100-continue not yet sent, a pipelined head read while
  the previous request is still answered;
- **connections**: each process serves ``connections`` at once; a request
  on one past them is a 503, with Retry-After, and its connection closed;
- **keep-alive**: uvicorn's own timer, set to ``keep_alive_s``.

Every refusal closes the connection: what else the client sent is not read.
A request that arrives whole sets no timer: one is set only when a read
leaves a request unfinished (and one at each connection's opening), and an
old timer that fires finds the deadline it now has and sets itself again.
The bookkeeping costs a keep-alive request 3 to 5 µs of CPU in the protocol
(15.5 µs a request for uvicorn's protocol alone, 20.2 for this one, the
fastest of seven runs each, on the shared two-core test machine): about
2 % of a heartbeat's 0.24 ms.

This leans on uvicorn's protocol's attributes (``cycle``, ``flow``,
``connections``, ``timeout_keep_alive``), as llmgw.admin_protocol does; the
tests (tests/core/test_listener_limits.py) run against the uvicorn
pyproject.toml allows.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import resource
from asyncio import TimerHandle
from collections.abc import Callable

import httptools
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from core.config import ListenerLimits

log = logging.getLogger(__name__)

# Where a connection is: waiting on no request of the client's (an answer being written, or kept idle, where
# uvicorn's keep-alive timer runs), reading a head, reading a body; done once refused or upgraded to a websocket.
_IDLE, _HEAD, _BODY, _DONE = range(4)
FD_RESERVE = 256
"""File descriptors a listener process keeps for what is not a client's connection: its database and Redis
connections, its logs. The connection cap is lowered to leave them (:func:`connection_cap`)."""


class _Refused(Exception):
    """Raised in a parser callback once the connection is refused: it stops the parser mid-read."""


class _Flow(FlowControl):
    """uvicorn's flow control, telling its protocol when reading stops and starts again: time the listener does
    not read is not the client's, and a resumption is where a 100-continue has just gone out."""

    def __init__(self, transport, protocol: BoundedHttpProtocol) -> None:
        super().__init__(transport)
        self.protocol = protocol
        self.paused_at = 0.0

    def pause_reading(self) -> None:
        if not self.read_paused:
            self.paused_at = self.protocol.loop.time()
        super().pause_reading()

    def resume_reading(self) -> None:
        if self.read_paused:
            self.protocol.held(self.paused_at)
        super().resume_reading()
        self.protocol.continued()


class BoundedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the limits above; :func:`serving` makes the factory uvicorn is given."""

    def __init__(self, *args, limits: ListenerLimits | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.limits = limits or ListenerLimits()
        self.timeout_keep_alive = self.limits.keep_alive_s
        self.phase = _HEAD
        self.since = 0.0
        """When the current phase began (the loop's clock): its deadline is this plus its limit."""
        self.head_bytes = 0
        self.heads = 0
        """Heads begun on this connection: tells the head a read began in from one that began within it."""
        self.begun = False
        """Whether a byte of the request being read has come: a connection that sent none is closed silently."""
        self.message_cycle = None
        """The ASGI request/response cycle of the request being read; None for one answered inline."""
        self.awaiting_continue = False
        """Whether the request being read waits for its 100-continue: its body's time begins when that is sent."""
        self.over_capacity = False
        self.deadline: TimerHandle | None = None
        self.deadline_at = 0.0

    # --- the connection ------------------------------------------------------------

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.flow = _Flow(transport, self)
        # Counted with itself, and with every websocket of this process's (uvicorn keeps both in one set).
        self.over_capacity = len(self.connections) > self.limits.connections
        self._begin_head()
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self.phase = _DONE
        if self.deadline is not None:
            self.deadline.cancel()
            self.deadline = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self._unset_keepalive_if_required()
        while data and self.phase != _DONE and not self.transport.is_closing():
            if self.phase == _IDLE:
                self._begin_head()
            if self.phase != _HEAD:
                # A pipelined head that begins in this read is counted from the next: it may pass the limit
                # by what of it this one held (asyncio reads 256 kB at most).
                self._feed(data)
                break
            # What the head may still take goes to the parser; the rest waits to see whether the head ended in it.
            # Where requests are pipelined, one that begins in that piece is counted from the rest: it may pass
            # the limit by what of it the piece held.
            room, heads = self.limits.head_bytes - self.head_bytes, self.heads
            piece, data = (data, b"") if len(data) <= room else (data[:room], data[room:])
            self.head_bytes += len(piece)
            if piece:
                self._feed(piece)
            if data and self.phase == _HEAD and self.heads == heads and not self.transport.is_closing():
                self.refuse(
                    431,
                    f"the request's head (its request line and headers) is larger than this listener takes "
                    f"({self.limits.head_bytes} bytes, LLMGW_LISTENER_HEAD_BYTES)",
                    "request_head_too_large",
                )
        if self.phase in (_HEAD, _BODY) and not self.transport.is_closing():
            self._arm()

    def _feed(self, data: bytes) -> None:
        """uvicorn's data_received, save its keep-alive timer's reset (done once a read) and save a parse error
        that is this protocol's own refusal stopping the parser."""
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            if self.phase != _DONE:
                self.logger.warning("Invalid HTTP request received.")
                self.send_400_response("Invalid HTTP request received.")
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()

    def handle_websocket_upgrade(self) -> None:
        self.phase = _DONE  # the websocket protocol takes the connection, with its own limits
        if self.deadline is not None:
            self.deadline.cancel()
            self.deadline = None
        super().handle_websocket_upgrade()

    # --- the request's phases; llmgw.admin_protocol's inline lane calls them too ----

    def on_message_begin(self) -> None:
        if self.phase == _IDLE:  # a pipelined request, begun in the read that ended the one before
            self._begin_head()
        self.begun = True
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        self.head_received()
        if self.over_capacity:
            self.refuse(
                503,
                f"this listener's process serves {self.limits.connections} connections at once "
                "(LLMGW_LISTENER_CONNECTIONS) and has them all; try again in a moment",
                "too_many_connections",
            )
            raise _Refused
        super().on_headers_complete()
        self.message_cycle = self.cycle
        self.awaiting_continue = self.expect_100_continue

    def on_message_complete(self) -> None:
        self.message_received()
        super().on_message_complete()

    def head_received(self) -> None:
        """The head has ended: the body's deadline begins."""
        self.phase, self.since, self.message_cycle, self.awaiting_continue = _BODY, self.loop.time(), None, False

    def message_received(self) -> None:
        """The body has ended: nothing is awaited from the client until the answer is written."""
        self.phase = _IDLE

    def _begin_head(self) -> None:
        self.phase, self.since, self.head_bytes, self.begun = _HEAD, self.loop.time(), 0, False
        self.heads += 1
        self.message_cycle = None

    # --- the deadlines ---------------------------------------------------------------

    def _arm(self) -> None:
        """A timer at the current phase's deadline, unless one is set that fires no later."""
        at = self.since + (self.limits.head_timeout_s if self.phase == _HEAD else self.limits.body_timeout_s)
        if self.deadline is not None:
            if self.deadline_at <= at:
                return
            self.deadline.cancel()
        self.deadline, self.deadline_at = self.loop.call_at(at, self._deadline_passed), at

    def _deadline_passed(self) -> None:
        self.deadline = None
        if self.phase not in (_HEAD, _BODY) or self.transport.is_closing():
            return  # set for a request since read: the next one's timer is set when a read leaves it unfinished
        now = self.loop.time()
        if self._held_by_the_listener():
            # Its end moves the deadline (held, continued, on_response_complete); until then, a look now and then.
            at = now + self._limit()
            self.deadline, self.deadline_at = self.loop.call_at(at, self._deadline_passed), at
            return
        if now < self.since + self._limit():
            return self._arm()  # set for an earlier phase, or moved since
        if not self.begun:
            self.refuse(0, "", "")
        elif self.phase == _HEAD:
            self.refuse(
                408,
                f"the request's head did not arrive whole within {self.limits.head_timeout_s:g} s "
                "(LLMGW_LISTENER_HEAD_TIMEOUT_S)",
                "request_timeout",
            )
        else:
            self.refuse(
                408,
                f"the request's body did not arrive whole within {self.limits.body_timeout_s:g} s of its head "
                "(LLMGW_LISTENER_BODY_TIMEOUT_S)",
                "request_timeout",
            )

    def _limit(self) -> float:
        return self.limits.head_timeout_s if self.phase == _HEAD else self.limits.body_timeout_s

    def _held_by_the_listener(self) -> bool:
        """Whether the client waits on this process rather than it on the client."""
        if self.flow.read_paused:
            return True  # a request queued behind one being answered, or a body its application has not taken
        cycle = self.cycle
        if cycle is None:
            return False
        if self.phase == _HEAD:
            return not cycle.response_complete  # a pipelined head: the answer before it is still being written
        # A 100-continue not sent yet, or an answer that began before the body ended (the rest is not needed).
        return cycle is self.message_cycle and (
            cycle.waiting_for_100_continue or (cycle.response_started and not cycle.response_complete)
        )

    def held(self, since: float) -> None:
        """Reading paused from ``since`` until now: the client's deadline moves by as long."""
        self.since += self.loop.time() - since

    def continued(self) -> None:
        """The application asked for the body: a client that waited for its 100-continue has its time from now."""
        if self.awaiting_continue and not self.message_cycle.waiting_for_100_continue:
            self.awaiting_continue = False
            self.since = self.loop.time()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        # A head begun, or a body left unsent, while this answer was written: the client's time begins now (not
        # moved again by the reading this resumed), and that deadline, not the keep-alive's, is the one to meet.
        if self.phase in (_HEAD, _BODY) and not self.transport.is_closing():
            self._unset_keepalive_if_required()
            self.since = self.loop.time()
            self._arm()

    # --- refusals --------------------------------------------------------------------

    def refuse(self, status: int, sentence: str, code: str) -> None:
        """Answer ``status`` with ``sentence`` (none when 0, or when this request's answer has begun), then close."""
        self.phase = _DONE
        # An answer being written (this request's, or the one before a pipelined head's) is cut, not interrupted
        # by another.
        cycle = self.cycle
        answering = (
            cycle is not None
            and cycle.response_started
            and (cycle is self.message_cycle or not cycle.response_complete)
        )
        if status and not answering:
            content_type, body = self.refusal_body(status, sentence, code)
            extra = ((b"retry-after", b"1"),) if status == 503 else ()
            self.write_whole(status, body, content_type, keep_alive=False, extra=extra)
        if not self.transport.is_closing():
            self.transport.close()

    def refusal_body(self, status: int, sentence: str, code: str) -> tuple[bytes, bytes]:
        """A refusal's content type and body, in the listener's error shape: the admin's ``{"error": sentence}``."""
        return b"application/json", json.dumps({"error": sentence}).encode()

    def write_whole(
        self,
        status: int,
        body: bytes,
        content_type: bytes,
        *,
        keep_alive: bool,
        extra: tuple[tuple[bytes, bytes], ...] = (),
    ) -> None:
        """An answer in one write, with the headers uvicorn would have sent; the connection is left as it is."""
        head = [STATUS_LINE[status]]
        for name, value in (*self.server_state.default_headers, *extra):
            head += [name, b": ", value, b"\r\n"]
        head += [b"content-type: ", content_type, b"\r\ncontent-length: ", str(len(body)).encode(), b"\r\n"]
        if not keep_alive:
            head.append(b"connection: close\r\n")
        head += [b"\r\n", body]
        self.transport.write(b"".join(head))


def connection_cap(configured: int, open_files: int) -> int:
    """The connections a process may serve: ``configured``, less what its open-file limit cannot hold.

    ``open_files``: the process's soft RLIMIT_NOFILE (negative: unlimited).
    Past that limit accept() fails (asyncio then stops accepting for a
    second) and so does every file or connection the process opens for
    itself, a database connection included; a cap below it keeps
    :data:`FD_RESERVE` of them for the process.
    """
    if open_files < 0:
        return configured
    return max(1, min(configured, open_files - FD_RESERVE))


def serving(protocol: type[BoundedHttpProtocol], limits: ListenerLimits) -> Callable[..., BoundedHttpProtocol]:
    """The protocol factory uvicorn's ``http`` setting takes: ``protocol`` with ``limits``, the cap fitted to
    this process's open-file limit (a warning in the log says when it was lowered)."""
    cap = connection_cap(limits.connections, resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    if cap < limits.connections:
        log.warning(
            "llmgw: LLMGW_LISTENER_CONNECTIONS is %d, and this process may open %d files: it serves %d connections "
            "at once (raise its open-file limit, LimitNOFILE= under systemd, to serve more)",
            limits.connections,
            cap + FD_RESERVE,
            cap,
        )
        limits = dataclasses.replace(limits, connections=cap)
    return functools.partial(protocol, limits=limits)
