"""Usage an engine reports past what its request allowed is clamped to the bound, flagged and counted.

The issue's finding: a rank-0 engine answered a ``max_tokens: 5`` request
with 2,147,483,647 tokens each way, and the key's 20,000-micro budget showed
4.29×10^9 spent. A request cannot use more than its prompt's bound and its
length × its choices, the bounds its reservation was made on: what an engine
claims past them is taken as the bound, the record says so (``clamped``),
and ``/metrics`` counts such records per model.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway import metrics as gateway_metrics
from gateway import tokens
from gateway.models import Budget, Team, UsageRecord
from tests.gateway.harness import app_on, at_once, key, model, replica

pytestmark = pytest.mark.django_db(transaction=True)

A_MICRO_A_TOKEN = (1_000_000, 1_000_000)
HOSTILE = (2**31 - 1, 2**31 - 1)
SHAPES = {
    "plain": ({}, {}),
    "stream": ({"usage": "vllm"}, {"stream": True}),
    "llama.cpp stream": ({"usage": "llamacpp"}, {"stream": True}),
}


def clamped_metric() -> dict[str, float]:
    family = next(f for f in gateway_metrics.collect() if f.name == "llmgw_gateway_usage_clamped")
    return {s.labels["model"]: s.value for s in family.samples}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_usage_an_engine_claims_past_what_the_request_allowed_is_clamped_flagged_and_counted(engines, shape):
    behaviour, extra = SHAPES[shape]
    replica(model("llama", price=A_MICRO_A_TOKEN), engines(reports=HOSTILE, **behaviour).url)
    secret = key()
    budget = Budget.objects.create(scope="team", team=Team.objects.get(), amount_micros=20_000, period="day")
    body = {"model": "llama", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 5, **extra}

    answers = at_once(lambda: app_on(), "/v1/chat/completions", body, secret, clients=2)
    assert [a.status for a in answers] == [200, 200]
    bound = tokens.prompt_of(body).bound()
    for record in UsageRecord.objects.all():
        assert (record.prompt_tokens, record.completion_tokens) == (bound, 5)
        assert record.clamped and record.counted_by == "engine"
        assert record.cost_micros == bound + 5
    budget.refresh_from_db()
    assert budget.spent_micros == 2 * (bound + 5) <= budget.amount_micros
    assert clamped_metric() == {"llama": 2}


def test_a_native_messages_answer_claiming_too_much_is_clamped_too(engines):
    engine = engines(reports=HOSTILE, messages=True)
    replica(model("llama", price=A_MICRO_A_TOKEN), engine.url, engine="vllm")
    body = {"model": "llama", "max_tokens": 5, "messages": [{"role": "user", "content": "hello"}]}
    [answer] = at_once(lambda: app_on(), "/v1/messages", body, key(), clients=1)
    assert answer.status == 200 and engine.stats.requests == 1
    record = UsageRecord.objects.get()
    assert record.completion_tokens == 5 and record.endpoint == "messages"
    assert record.prompt_tokens <= tokens.prompt_of(body).bound()
    assert record.clamped


@pytest.fixture
def told_engine(engines):
    """An engine whose reported usage each example sets, and a key."""
    engine = engines(tokens=4)
    replica(model("llama", price=A_MICRO_A_TOKEN), engine.url)
    return engine, key()


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    prompt=st.integers(0, 2**31 - 1) | st.integers(0, 200),
    completion=st.integers(0, 2**31 - 1) | st.integers(0, 200),
    max_tokens=st.integers(1, 50),
    n=st.integers(1, 4),
)
def test_a_record_holds_what_the_engine_said_within_the_bound_and_is_flagged_only_past_it(
    told_engine, prompt, completion, max_tokens, n
):
    engine, secret = told_engine
    UsageRecord.objects.all().delete()
    engine.engine.behaviour.reports = (prompt, completion)
    body = {"model": "llama", "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens, "n": n}
    [answer] = at_once(lambda: app_on(), "/v1/chat/completions", body, secret, clients=1)
    assert answer.status == 200
    record = UsageRecord.objects.get()
    prompt_bound, completion_bound = tokens.prompt_of(body).bound(), max_tokens * n
    assert record.prompt_tokens == min(prompt, prompt_bound)
    assert record.completion_tokens == min(completion, completion_bound)
    assert record.clamped == (prompt > prompt_bound or completion > completion_bound)
