"""OpenTelemetry traces for llmgw's processes, configured by the standard ``OTEL_*`` variables.

Tracing is on in a process when :func:`setup` found somewhere to send spans:
``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``)
set, with ``OTEL_TRACES_EXPORTER`` unset or ``otlp``; or
``OTEL_TRACES_EXPORTER=console``. ``OTEL_SDK_DISABLED=true`` or
``OTEL_TRACES_EXPORTER=none`` turn it off whatever else is set. Spans go out
over OTLP/HTTP (protobuf) in batches from a thread of the SDK's
(``OTEL_BSP_*`` tune it); ``OTEL_SERVICE_NAME`` and
``OTEL_RESOURCE_ATTRIBUTES`` name the process, ``OTEL_PROPAGATORS`` choose the
header formats (W3C ``traceparent`` by default).

Off, nothing is made: no provider, no exporter, no thread, and
:func:`span` hands back one shared do-nothing object, so a request pays
one global read per span it would have had.

Each process sets up its own provider (the exporter's thread and
connection do not survive a fork): ``llmgw serve``, each gateway worker
process, each Celery worker process (``worker_process_init``). A process
that forked after setup (``os.fork``) makes its own on its next setup call.
"""

from __future__ import annotations

import contextlib
import logging
import os

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace

log = logging.getLogger("llmgw.tracing")

_provider = None
_tracer: trace.Tracer | None = None
_pid = 0


def _true(value: str | None) -> bool:
    return (value or "").strip().lower() == "true"


def exporters(env: dict[str, str] | os._Environ = os.environ) -> list[str]:
    """The span exporters the environment asks for and can have ("otlp", "console"); none: tracing is off.

    ``otlp`` counts only with an endpoint: the SDK's default (localhost:4318)
    would send every span to whatever listens there, or retry into nothing.
    """
    if _true(env.get("OTEL_SDK_DISABLED")):
        return []
    names = [n.strip().lower() for n in (env.get("OTEL_TRACES_EXPORTER") or "otlp").split(",") if n.strip()]
    if "none" in names:
        return []
    endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    chosen = []
    for name in names:
        if (name == "otlp" and endpoint) or name == "console":
            chosen.append(name)
        elif name != "otlp":
            log.warning("llmgw: OTEL_TRACES_EXPORTER=%s is not one llmgw has (otlp, console, none); ignored", name)
    return chosen


def _exporter(name: str):
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    protocol = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
    if protocol and protocol != "http/protobuf":
        log.warning("llmgw: OTEL_EXPORTER_OTLP_PROTOCOL=%s: llmgw sends OTLP over http/protobuf only", protocol)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    # The exporter reads the endpoint, headers, timeout and compression from OTEL_EXPORTER_OTLP_*.
    return OTLPSpanExporter()


def setup(service: str) -> bool:
    """Start tracing in this process when the environment asks for it; True when it is on.

    ``service`` names the process when ``OTEL_SERVICE_NAME`` (or a
    ``service.name`` in ``OTEL_RESOURCE_ATTRIBUTES``) does not. Called again
    in the same process it changes nothing; in a forked child it makes the
    child's own provider.
    """
    global _provider, _tracer, _pid
    if _tracer is not None and _pid == os.getpid():
        return True
    _provider = _tracer = None
    chosen = exporters()
    if not chosen:
        return False
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: service}))
    provider = TracerProvider(resource=resource)
    for name in chosen:
        provider.add_span_processor(BatchSpanProcessor(_exporter(name)))
    _provider, _tracer, _pid = provider, provider.get_tracer("llmgw"), os.getpid()
    # Also the global one, for libraries that trace through the API; it can be set once per process.
    with contextlib.suppress(Exception):
        if not isinstance(trace.get_tracer_provider(), TracerProvider):
            trace.set_tracer_provider(provider)
    return True


def shutdown() -> None:
    """Send what is queued and stop this process's tracing (the process is ending, or a test is done)."""
    global _provider, _tracer
    provider, _provider, _tracer = _provider, None, None
    if provider is not None:
        provider.shutdown()


def flush(timeout_ms: int = 5000) -> None:
    """Send the spans queued so far."""
    if _provider is not None:
        _provider.force_flush(timeout_ms)


def on() -> bool:
    """Whether this process traces."""
    return _tracer is not None


def tracer() -> trace.Tracer | None:
    """This process's tracer; None when tracing is off."""
    return _tracer


class _Nothing:
    """What :func:`span` gives when tracing is off: a context manager and a span that do nothing."""

    __slots__ = ()

    def __enter__(self) -> _Nothing:
        return self

    def __exit__(self, *exc) -> None:
        return None

    def set_attribute(self, key, value) -> None:
        pass

    def set_attributes(self, attributes) -> None:
        pass

    def add_event(self, name, attributes=None, timestamp=None) -> None:
        pass

    def is_recording(self) -> bool:
        return False


NOTHING = _Nothing()


def span(name: str, attributes: dict | None = None, *, parent=None, kind=trace.SpanKind.INTERNAL):
    """A context manager that times ``name`` as a child of the current span (or of ``parent``, a context).

    Off, it is :data:`NOTHING`.
    """
    if _tracer is None:
        return NOTHING
    return _tracer.start_as_current_span(name, context=parent, kind=kind, attributes=attributes)


def context():
    """The current trace context, to parent later work on (None when off)."""
    if _tracer is None:
        return None
    return otel_context.get_current()


def annotate(attributes: dict) -> None:
    """Set attributes on the current span (nothing when off)."""
    if _tracer is not None:
        trace.get_current_span().set_attributes(attributes)


def extract(headers: dict[str, str]):
    """The trace context a caller's headers carry (``traceparent``, ``tracestate``)."""
    return propagate.extract(headers)


def inject() -> dict[str, str]:
    """The headers that carry the current span on to the next hop ({} when off)."""
    if _tracer is None:
        return {}
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier
