"""For any JSON body within the limit, every /v1 endpoint of the gateway listener answers below 500.

The gateway app runs in-process on its own event loop (as under uvicorn), in front of a fake
engine that, like a real one, answers 400 to a body its request schema refuses. Each example
is a body sent with a valid key: arbitrary JSON, objects of the OpenAI fields with arbitrary
values (for a served and priced model, an unknown one, or a wrong type), nesting just past the
shared reader's limit and far past it, and bytes that are not JSON. After each the gateway
still serves a plain chat.
"""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from gateway.proxy import ENDPOINTS
from tests.api.test_hostile_bodies import json_value, nested
from tests.gateway.fake_engine import Behaviour, EngineThread
from tests.gateway.harness import call, key, model, new_app, replica, settle

pytestmark = pytest.mark.django_db(transaction=True)

OPENAI_FIELDS = [
    *("messages", "prompt", "input", "max_tokens", "max_completion_tokens", "stream", "stream_options"),
    *("tools", "tool_choice", "n", "temperature", "stop", "user", "response_format", "logit_bias", "seed"),
]
SERVED = "llama"
model_name = st.one_of(st.just(SERVED), st.text(max_size=20), json_value)
openai_body = st.builds(
    lambda name, fields: {"model": name, **fields},
    model_name,
    st.dictionaries(st.sampled_from(OPENAI_FIELDS), json_value, max_size=5),
)
raw_body = st.one_of(
    openai_body.map(lambda v: json.dumps(v).encode()),
    json_value.map(lambda v: json.dumps(v).encode()),
    st.sampled_from([65, 999, 5000, 100_000]).map(nested),
    st.binary(max_size=40),
)
HELLO = {"model": SERVED, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}


class Loop:
    """An event loop on a thread, holding one gateway app across examples."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.app = new_app()

    def run(self, coro, timeout: float = 20.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.run(settle(self.app))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@pytest.fixture
def gateway(transactional_db, monkeypatch):
    engine = EngineThread(Behaviour(refuse_unreadable=True))
    replica(model(SERVED, price=(1_000_000, 2_000_000)), engine.url)
    secret = key()
    running = Loop()
    yield running, secret
    running.close()
    engine.stop()


@settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(endpoint=st.sampled_from(sorted(ENDPOINTS)), body=raw_body)
def test_no_body_on_any_v1_endpoint_is_a_server_error(gateway, endpoint, body):
    running, secret = gateway
    answer = running.run(call(running.app, f"/v1/{endpoint}", body, key=secret))
    event(f"{endpoint} {answer.status}")
    assert answer.status < 500, (endpoint, body[:200], answer.body[:500])
    assert running.run(call(running.app, "/v1/chat/completions", HELLO, key=secret)).status == 200


def test_nesting_past_the_readers_limit_is_a_sentence_on_every_v1_endpoint(gateway):
    running, secret = gateway
    for endpoint in sorted(ENDPOINTS):
        answer = running.run(call(running.app, f"/v1/{endpoint}", b"[" * 5000 + b"]" * 5000, key=secret))
        assert answer.status == 400, endpoint
        assert "nested deeper than 64 levels" in answer.json()["error"]["message"], endpoint
