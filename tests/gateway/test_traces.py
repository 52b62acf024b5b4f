"""Traces through the real gateway: ``llmgw serve`` with OTEL_EXPORTER_OTLP_ENDPOINT at a receiver of the test's.

A client's ``traceparent`` becomes the parent of the gateway's request span,
each step of the request is a span of that trace, and the engine is handed
a ``traceparent`` whose parent is the gateway's span for that exchange (what
vLLM makes its own request span a child of).
"""

from __future__ import annotations

import asyncio
import threading
import time

import openai
import pytest
import redis.asyncio as aioredis
from django.db import connection

from core import tracing
from gateway.asgi import GatewayApp
from gateway.proxy import Gateway
from gateway.tracing import traced
from placement.models import Replica, ReplicaState
from tests.core.test_serve import Server
from tests.gateway.harness import FAST, call, key, model, replica, settle
from tests.gateway.test_ratelimit import REDIS_URL, redis_db  # noqa: F401 (a fixture)
from tests.gateway.test_serve_gateway import server_env
from tests.otlp import Receiver, otel_env  # noqa: F401 (a fixture)

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
STEPS = (
    "POST /v1/chat/completions",
    "gateway.admission",
    "gateway.route",
    "gateway.upstream",
    "gateway.first_byte",
    "gateway.stream",
    "gateway.usage_write",
)


@pytest.fixture(scope="module")
def receiver():
    started = Receiver()
    yield started
    started.stop()


@pytest.fixture(scope="module")
def traced_server(django_db_setup, django_db_blocker, tmp_path_factory, receiver):
    with django_db_blocker.unblock():
        env = server_env()
    env.update(
        OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint,
        OTEL_BSP_SCHEDULE_DELAY="50",  # ms between batches: the test need not wait the default 5 s
        LLMGW_GATEWAY_WORKERS="2",
        LLMGW_EVERY_RECONCILE="1",
    )
    started = Server(tmp_path_factory.mktemp("serve"), **env)
    try:
        started.wait_ready()
        yield started
    finally:
        started.stop()


def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://{server.gateway}/v1", api_key=key())


def mark_ready(pk: str) -> None:
    """On a thread of its own, as placement would; its connection closed after, or the test database stays in use."""
    try:
        Replica.objects.filter(pk=pk).update(state=ReplicaState.READY)
    finally:
        connection.close()


def hello(**extra):
    return {"model": "llama", "messages": [{"role": "user", "content": "hello there"}], **extra}


def test_a_chat_request_is_one_trace_under_the_clients_traceparent_and_the_engine_gets_it(
    traced_server, receiver, engines
):
    engine = engines(tokens=3)
    replica(model("llama"), engine.url)

    answer = client(traced_server).chat.completions.create(
        **hello(), extra_headers={"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"}
    )
    assert answer.choices[0].message.content == "w0 w1 w2"

    spans = receiver.wait_for(*STEPS, trace_id=CLIENT_TRACE)
    root = spans["POST /v1/chat/completions"]
    assert root.parent_span_id == CLIENT_SPAN and root.service == "llmgw-gateway"
    assert root.kind == 2 and root.attributes["http.response.status_code"] == 200  # SERVER
    for step in ("gateway.admission", "gateway.route", "gateway.usage_write"):
        assert spans[step].parent_span_id == root.span_id, step
    upstream = spans["gateway.upstream"]
    assert upstream.parent_span_id == spans["gateway.route"].span_id and upstream.kind == 3  # CLIENT
    assert upstream.attributes["llmgw.model"] == "llama" and upstream.attributes["http.response.status_code"] == 200
    first, stream = spans["gateway.first_byte"], spans["gateway.stream"]
    assert first.parent_span_id == stream.parent_span_id == upstream.span_id
    assert upstream.start_ns <= first.start_ns <= first.end_ns <= stream.start_ns <= stream.end_ns <= upstream.end_ns
    assert spans["gateway.admission"].attributes["llmgw.requested"] == "llama"

    (sent,) = [h for h in engine.stats.headers if "traceparent" in h]
    assert sent["traceparent"] == f"00-{CLIENT_TRACE}-{upstream.span_id}-01"


def test_a_streamed_request_without_a_traceparent_starts_its_own_trace(traced_server, receiver, engines):
    engine = engines(tokens=4, token_delay_s=0.05)
    replica(model("llama"), engine.url)
    text = ""
    for chunk in client(traced_server).chat.completions.create(**hello(stream=True)):
        text += chunk.choices[0].delta.content or ""
    assert text == "w0 w1 w2 w3 "

    (sent,) = [h for h in engine.stats.headers if "traceparent" in h]
    trace_id = sent["traceparent"].split("-")[1]
    spans = receiver.wait_for(*STEPS, trace_id=trace_id)
    assert spans["POST /v1/chat/completions"].parent_span_id == ""
    stream = spans["gateway.stream"]
    assert stream.attributes["llmgw.streamed"] is True
    assert stream.end_ns - stream.start_ns >= 0.1e9  # the tokens came 50 ms apart, after the first


def test_waiting_for_a_model_scaled_to_zero_is_a_span(traced_server, receiver, engines):
    engine = engines()
    starting = replica(model("llama", min_replicas=0), engine.url, state=ReplicaState.STARTING)
    # Placement marks the replica ready a second after the request asks for it.
    threading.Timer(1.0, mark_ready, (starting.pk,)).start()

    client(traced_server).chat.completions.create(**hello())

    (sent,) = [h for h in engine.stats.headers if "traceparent" in h]
    trace_id = sent["traceparent"].split("-")[1]
    spans = receiver.wait_for("gateway.wait_for_replica", "gateway.upstream", trace_id=trace_id)
    waited = spans["gateway.wait_for_replica"]
    assert waited.end_ns - waited.start_ns >= 0.5e9
    assert waited.end_ns <= spans["gateway.upstream"].start_ns


def test_the_reconciler_of_llmgw_serve_traces_its_passes(traced_server, receiver):
    """A pass plans inside its own span. Only a pass with a model to plan for has a plan (one with an empty
    catalog reads no fleet: placement.writes.reconciler), so the test gives it one, and looks for the pass
    that is the plan's parent rather than the first pass."""
    model("planned")
    plan = receiver.wait_for("placement.reconcile.plan", "placement.reconcile.writes")["placement.reconcile.plan"]
    deadline = time.monotonic() + 15
    while (passes := {s.span_id: s for s in list(receiver.spans) if s.name == "placement.reconcile"}).get(
        plan.parent_span_id
    ) is None:
        assert time.monotonic() < deadline, "no reconcile span is the plan's parent"
        time.sleep(0.1)
    assert passes[plan.parent_span_id].service in ("llmgw", "llmgw-worker")


def test_with_redis_the_rate_limit_check_is_a_span_of_its_own(otel_env, receiver, engines, redis_db):  # noqa: F811
    otel_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
    assert tracing.setup("llmgw-gateway")
    engine = engines()
    replica(model("llama"), engine.url)
    secret = key()

    async def go():
        app = GatewayApp(lambda: Gateway(FAST, aioredis.from_url(REDIS_URL)))
        try:
            return await call(traced(app), "/v1/chat/completions", hello(), key=secret)
        finally:
            await settle(app)

    assert asyncio.run(go()).status == 200
    tracing.flush()
    (sent,) = [h for h in engine.stats.headers if "traceparent" in h]
    trace_id = sent["traceparent"].split("-")[1]
    spans = receiver.wait_for("POST /v1/chat/completions", "gateway.admission", "gateway.rate_limit", trace_id=trace_id)
    root = spans["POST /v1/chat/completions"]
    assert spans["gateway.rate_limit"].parent_span_id == root.span_id
    assert spans["gateway.admission"].end_ns <= spans["gateway.rate_limit"].start_ns
