"""An OTLP/HTTP trace receiver for tests: ``POST /v1/traces`` protobuf bodies, decoded and kept.

What a collector (the OpenTelemetry Collector, Jaeger, Tempo) would receive
from llmgw, read with opentelemetry-proto's own ExportTraceServiceRequest.
"""

from __future__ import annotations

import gzip
import os
import threading
import time
import zlib
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from opentelemetry.exporter.otlp.proto.http import trace_exporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from core import tracing


@dataclass(frozen=True)
class ReceivedSpan:
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    kind: int
    service: str
    attributes: dict
    start_ns: int
    end_ns: int


def _value(any_value):
    kind = any_value.WhichOneof("value")
    return getattr(any_value, kind) if kind else None


def decode(body: bytes) -> list[ReceivedSpan]:
    """The spans in one export request's protobuf body."""
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    spans = []
    for resource_spans in request.resource_spans:
        resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans.append(
                    ReceivedSpan(
                        name=span.name,
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_span_id=span.parent_span_id.hex(),
                        kind=span.kind,
                        service=resource.get("service.name", ""),
                        attributes={a.key: _value(a.value) for a in span.attributes},
                        start_ns=span.start_time_unix_nano,
                        end_ns=span.end_time_unix_nano,
                    )
                )
    return spans


class Receiver:
    """A collector on a free local port; ``endpoint`` is what OTEL_EXPORTER_OTLP_ENDPOINT takes."""

    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.posts = 0
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                encoding = self.headers.get("content-encoding", "")
                if encoding == "gzip":
                    body = gzip.decompress(body)
                elif encoding == "deflate":
                    body = zlib.decompress(body)
                if self.path != "/v1/traces":
                    self.send_response(404)
                    self.end_headers()
                    return
                with receiver._lock:
                    receiver.posts += 1
                    receiver.spans.extend(decode(body))
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def named(self, name: str) -> list[ReceivedSpan]:
        with self._lock:
            return [s for s in self.spans if s.name == name]

    def wait_for(self, *names: str, trace_id: str | None = None, timeout: float = 15.0) -> dict[str, ReceivedSpan]:
        """The first span of each name (of ``trace_id`` when given), once all have arrived."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                found = {}
                for span in self.spans:
                    if span.name in names and span.name not in found and trace_id in (None, span.trace_id):
                        found[span.name] = span
            if len(found) == len(names):
                return found
            if time.monotonic() > deadline:
                have = sorted({s.name for s in self.spans})
                raise AssertionError(f"spans {sorted(set(names) - set(found))} never arrived; got {have}")
            time.sleep(0.05)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def otel_env(monkeypatch):
    """No OTEL_* variable but those a test sets; tracing shut down after."""
    for name in list(os.environ):
        if name.startswith("OTEL_"):
            monkeypatch.delenv(name)
    tracing.shutdown()
    yield monkeypatch
    tracing.shutdown()


@pytest.fixture
def receiver():
    started = Receiver()
    yield started
    started.stop()


@pytest.fixture
def exporters_made(monkeypatch):
    """Every OTLP exporter made, counted."""
    made = []
    original = trace_exporter.OTLPSpanExporter.__init__

    def counting(self, *args, **kwargs):
        made.append(self)
        original(self, *args, **kwargs)

    monkeypatch.setattr(trace_exporter.OTLPSpanExporter, "__init__", counting)
    return made
