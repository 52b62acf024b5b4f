"""core.tracing: on only when an OTEL_* endpoint (or the console) is configured, and then real OTLP/HTTP."""

from __future__ import annotations

import os

import pytest

from core import tracing
from gateway.tracing import NO_EXCHANGE, exchange, traced
from tests.otlp import exporters_made, otel_env, receiver  # noqa: F401 (fixtures)

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_PARENT = f"00-{CLIENT_TRACE}-00f067aa0ba902b7-01"


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, []),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, []),  # no endpoint: not the SDK's localhost default
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, ["otlp"]),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, ["otlp"]),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "true"}, []),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "TRUE"}, []),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "false"}, ["otlp"]),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_EXPORTER": "none"}, []),
        ({"OTEL_TRACES_EXPORTER": "console"}, ["console"]),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_EXPORTER": "otlp,console"}, ["otlp", "console"]),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_EXPORTER": "zipkin"}, []),
    ],
)
def test_the_exporters_follow_the_standard_variables(env, expected):
    assert tracing.exporters(env) == expected


def test_with_no_endpoint_nothing_is_made_and_nothing_is_sent(otel_env, receiver, exporters_made):  # noqa: F811
    assert tracing.setup("llmgw-test") is False
    assert not tracing.on() and tracing.tracer() is None and exporters_made == []
    with tracing.span("gateway.admission") as span:
        assert span is tracing.NOTHING
        tracing.annotate({"llmgw.model": "llama"})
    assert tracing.inject() == {} and tracing.context() is None
    app = object()
    assert traced(app) is app
    with exchange("r1", "llama", "http://e/v1/chat/completions") as ex:
        assert ex is NO_EXCHANGE and ex.headers() is None
    tracing.flush()
    assert receiver.posts == 0


def test_sdk_disabled_wins_over_an_endpoint(otel_env, receiver, exporters_made):  # noqa: F811
    otel_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
    otel_env.setenv("OTEL_SDK_DISABLED", "true")
    assert tracing.setup("llmgw-test") is False and exporters_made == []


def test_spans_go_to_the_configured_endpoint_over_otlp_http(otel_env, receiver, exporters_made):  # noqa: F811
    otel_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
    otel_env.setenv("OTEL_SERVICE_NAME", "gw-east")
    assert tracing.setup("llmgw-test") is True and len(exporters_made) == 1
    assert tracing.setup("llmgw-test") is True and len(exporters_made) == 1  # once a process
    parent = tracing.extract({"traceparent": CLIENT_PARENT})
    with tracing.span("outer", parent=parent), tracing.span("inner", {"llmgw.model": "llama"}):
        onward = tracing.inject()["traceparent"]
    tracing.flush()
    spans = receiver.wait_for("outer", "inner", trace_id=CLIENT_TRACE)
    assert spans["outer"].parent_span_id == "00f067aa0ba902b7"
    assert spans["inner"].parent_span_id == spans["outer"].span_id
    assert spans["inner"].attributes == {"llmgw.model": "llama"} and spans["inner"].service == "gw-east"
    assert onward.split("-")[1] == CLIENT_TRACE and onward.split("-")[2] == spans["inner"].span_id


def test_the_service_name_defaults_to_the_process_kind(otel_env, receiver):  # noqa: F811
    otel_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
    tracing.setup("llmgw-gateway")
    with tracing.span("one"):
        pass
    tracing.flush()
    assert receiver.wait_for("one")["one"].service == "llmgw-gateway"


def test_a_forked_child_sets_up_a_provider_of_its_own(otel_env, receiver):  # noqa: F811
    otel_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
    tracing.setup("llmgw-parent")
    parents = tracing.tracer()
    pid = os.fork()
    if pid == 0:  # the child: its own provider, exporter and thread
        code = 1
        try:
            os.environ["OTEL_SERVICE_NAME"] = "llmgw-child"
            if tracing.setup("llmgw-child") and tracing.tracer() is not parents:
                with tracing.span("in the child"):
                    pass
                tracing.shutdown()
                code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    child = receiver.wait_for("in the child")["in the child"]
    assert child.service == "llmgw-child"
