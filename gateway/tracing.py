"""The gateway's spans: one per request, its steps, and each exchange with an engine.

A request's spans (when tracing is on, see core.tracing)::

    POST /v1/chat/completions         SERVER, the client's traceparent as its parent
      gateway.admission               key, allowed models, rate limits, budget reservation
      gateway.rate_limit              with Redis: the rate limits' Lua call
      gateway.route                   the replicas tried, fallbacks included
        gateway.wait_for_replica      a model scaled to zero, until a replica is ready
        gateway.upstream              CLIENT, one engine exchange; its traceparent goes to the engine
          gateway.first_byte          from asking the engine to its first byte of answer
          gateway.stream              from that byte to the end of the answer relayed
      gateway.usage_write             counting, pricing and queueing the usage record

Off, :func:`traced` hands the app back unwrapped and :func:`exchange` a
shared do-nothing object: the request path is what it was.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from core import tracing

PROPAGATED = (b"traceparent", b"tracestate", b"baggage")


def traced(app):
    """``app`` (an ASGI app) with a SERVER span around each HTTP request; ``app`` itself when tracing is off."""
    if not tracing.on():
        return app
    return TracedApp(app)


class TracedApp:
    """An ASGI app's requests, each in a span whose parent is the client's ``traceparent``."""

    def __init__(self, app) -> None:
        self.app = app

    def __getattr__(self, name):
        # close() and the app's other parts stay reachable through the wrapper.
        return getattr(self.app, name)

    async def __call__(self, scope, receive, send) -> None:
        tracer = tracing.tracer()
        if scope["type"] != "http" or tracer is None:
            return await self.app(scope, receive, send)
        carrier = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers", ()) if k in PROPAGATED}
        method, path = scope.get("method", ""), scope.get("path", "")
        attributes = {"http.request.method": method, "url.path": path, "http.route": path}
        with tracer.start_as_current_span(
            f"{method} {path}", context=tracing.extract(carrier), kind=SpanKind.SERVER, attributes=attributes
        ) as span:

            async def sending(message) -> None:
                if message["type"] == "http.response.start":
                    status = message["status"]
                    span.set_attribute("http.response.status_code", status)
                    if status >= 500:
                        span.set_status(Status(StatusCode.ERROR))
                await send(message)

            await self.app(scope, receive, sending)


class Exchange:
    """One exchange with an engine: its span, the traceparent for the engine, first byte and end."""

    __slots__ = ("first", "span", "started")

    def __init__(self, span: trace.Span) -> None:
        self.span = span
        self.started = time.time_ns()
        self.first: int | None = None

    def headers(self) -> dict[str, str]:
        """The headers that make the engine's spans children of this exchange."""
        with trace.use_span(self.span, end_on_exit=False):
            return tracing.inject()

    def failed(self, why: str) -> None:
        """The engine failed before answering (another replica may be tried)."""
        self.span.set_status(Status(StatusCode.ERROR, why))

    def first_byte(self) -> None:
        """The engine's first byte of answer arrived: the ``gateway.first_byte`` span ends here."""
        if self.first is not None:
            return
        self.first = time.time_ns()
        self._child("gateway.first_byte", self.started, self.first)

    def end(self, status: int, outcome: str, streamed: bool) -> None:
        """The answer was relayed to its end (or broke off): the ``gateway.stream`` span ends here."""
        self.span.set_attributes({"http.response.status_code": status, "llmgw.outcome": outcome})
        if status >= 500 and outcome != "ok":
            self.span.set_status(Status(StatusCode.ERROR, outcome))
        if self.first is not None:
            self._child("gateway.stream", self.first, time.time_ns(), {"llmgw.streamed": streamed})

    def _child(self, name: str, start: int, end: int, attributes: dict | None = None) -> None:
        tracer = tracing.tracer()
        if tracer is None:
            return
        ctx = trace.set_span_in_context(self.span)
        tracer.start_span(name, context=ctx, start_time=start, attributes=attributes).end(end_time=end)


class _NoExchange:
    __slots__ = ()

    def headers(self) -> None:
        return None

    def failed(self, why: str) -> None:
        pass

    def first_byte(self) -> None:
        pass

    def end(self, status: int, outcome: str, streamed: bool) -> None:
        pass


NO_EXCHANGE = _NoExchange()
_NO_EXCHANGE = contextlib.nullcontext(NO_EXCHANGE)  # reusable: off, nothing is made per request


@contextlib.contextmanager
def _exchange(tracer: trace.Tracer, replica: str, model: str, url: str) -> Iterator[Exchange]:
    attributes = {"llmgw.replica": replica, "llmgw.model": model, "url.full": url}
    with tracer.start_as_current_span("gateway.upstream", kind=SpanKind.CLIENT, attributes=attributes) as span:
        yield Exchange(span)


def exchange(replica: str, model: str, url: str):
    """A context manager around one engine exchange, giving its :class:`Exchange` (a do-nothing one when off)."""
    tracer = tracing.tracer()
    if tracer is None:
        return _NO_EXCHANGE
    return _exchange(tracer, replica, model, url)
