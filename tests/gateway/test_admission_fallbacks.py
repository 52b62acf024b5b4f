"""Fallbacks are admitted hop by hop: the model that serves was allowed for the key, and paid for.

Each scenario runs through the gateway's admission: PostgreSQL statements
on the event loop (gateway.pgpath), which hand the uncommon cases (a
fallback among them) to the ORM's rule on a thread (gateway.admission).
"""

from __future__ import annotations

import asyncio

import pytest

from gateway.asgi import GatewayApp
from gateway.models import ApiKey, Budget, Team, UsageRecord
from gateway.proxy import Gateway
from placement.models import ReplicaState
from tests.gateway.harness import FAST, call, fallback, key, model, replica, settle

pytestmark = pytest.mark.django_db(transaction=True)

CHAT = "/v1/chat/completions"


def run(scenario):
    async def go():
        app = GatewayApp(lambda: Gateway(FAST))
        try:
            return await scenario(app)
        finally:
            await settle(app)

    return asyncio.run(go())


def ask(name: str, max_tokens: int = 8) -> dict:
    return {"model": name, "max_tokens": max_tokens, "messages": [{"role": "user", "content": "say hello to everyone"}]}


def test_a_200_micro_budget_is_not_spent_480_through_a_free_models_fallback(engines):
    # The report: a free model with nothing ready falls back to a priced one;
    # the free one reserved nothing, so every request was let in.
    free = model("free")
    priced = model("priced", price=(0, 15_000_000))  # 15 micros a completion token: 120 a request
    fallback(free, priced)
    replica(priced, engines(tokens=8).url)
    secret = key()
    budget = Budget.objects.create(scope="team", team=Team.objects.get(), amount_micros=200, period="day")

    async def four(app):
        return [await call(app, CHAT, ask("free"), key=secret) for _ in range(4)]

    answers = run(four)
    budget.refresh_from_db()
    assert budget.spent_micros <= 200, [a.status for a in answers]
    assert budget.reserved_micros == 0
    assert answers[0].status == 200 and answers[0].headers["x-llmgw-model"] == "priced"
    refused = [a for a in answers if a.status != 200]
    assert refused and all(a.status == 429 and a.json()["error"]["code"] == "budget_exceeded" for a in refused)


def test_a_key_limited_to_a_model_is_not_served_by_its_fallback(engines):
    only = model("only")
    other = model("other")
    fallback(only, other)
    engine = engines()
    replica(other, engine.url)
    replica(only, "http://127.0.0.1:1", state=ReplicaState.STARTING)
    secret = key(models=["only"])

    answer = run(lambda app: call(app, CHAT, ask("only"), key=secret))

    assert answer.status == 503 and engine.stats.requests == 0
    error = answer.json()["error"]["message"]
    # The fallback the key may not use is not even named to it.
    assert "'only'" in error and "other" not in error
    assert UsageRecord.objects.get().model == ""


def test_a_fallback_the_key_may_use_by_its_alias_is_served(engines):
    first = model("first")
    second = model("second", aliases=["backup"])
    fallback(first, second)
    replica(second, engines().url)
    secret = key(models=["first", "backup"])
    answer = run(lambda app: call(app, CHAT, ask("first"), key=secret))
    assert answer.status == 200 and answer.headers["x-llmgw-model"] == "second"


def test_a_disallowed_hop_is_skipped_for_the_next_allowed_one(engines):
    first, banned, third = model("first"), model("banned"), model("third")
    fallback(first, banned, 0)
    fallback(first, third, 1)
    banned_engine, third_engine = engines(), engines()
    replica(banned, banned_engine.url)
    replica(third, third_engine.url)
    secret = key(models=["first", "third"])
    answer = run(lambda app: call(app, CHAT, ask("first"), key=secret))
    assert answer.status == 200 and answer.headers["x-llmgw-model"] == "third"
    assert banned_engine.stats.requests == 0


def test_a_dearer_fallback_the_budget_cannot_cover_is_refused_before_its_engine(engines):
    cheap = model("cheap", price=(0, 1_000_000))  # 8 micros for 8 tokens
    dear = model("dear", price=(0, 100_000_000))  # 800 micros for 8 tokens
    fallback(cheap, dear)
    engine = engines()
    replica(dear, engine.url)
    secret = key()
    budget = Budget.objects.create(scope="key", key=ApiKey.objects.get(), amount_micros=100, period="day")

    answer = run(lambda app: call(app, CHAT, ask("cheap"), key=secret))

    assert answer.status == 429 and "budget of key" in answer.json()["error"]["message"]
    assert engine.stats.requests == 0
    budget.refresh_from_db()
    assert (budget.spent_micros, budget.reserved_micros) == (0, 0)


def test_while_a_fallback_serves_the_reservation_is_at_its_price(engines):
    dear = model("dear", price=(0, 100_000_000))  # 100 micros a token: 1,000 for max_tokens 10
    cheap = model("cheap", price=(0, 1_000_000))  # 1 micro a token: 10
    fallback(dear, cheap)
    engine = engines(tokens=3, token_delay_s=0.2)
    replica(cheap, engine.url)
    secret = key()
    team = Budget.objects.create(scope="team", team=Team.objects.get(), amount_micros=10_000, period="day")
    org = Budget.objects.create(scope="org", org=Team.objects.get().org, amount_micros=10_000, period="day")
    body = {**ask("dear", max_tokens=10), "stream": True}

    async def scenario(app):
        request = asyncio.ensure_future(call(app, CHAT, body, key=secret))
        while engine.stats.requests == 0:
            await asyncio.sleep(0.01)
        held = await app.gateway.run_db(lambda: sorted(Budget.objects.values_list("reserved_micros", flat=True)))
        return held, await request

    held, answer = run(scenario)
    assert answer.status == 200 and answer.headers["x-llmgw-model"] == "cheap"
    assert held == [10, 10]  # the dear model's 1,000 was given back before the cheap one's engine was asked
    for budget in (team, org):
        budget.refresh_from_db()
        assert (budget.spent_micros, budget.reserved_micros) == (3, 0)


def test_a_priced_fallback_of_a_free_model_is_refused_by_a_spent_budget(engines):
    free = model("free")
    priced = model("priced", price=(1_000_000, 1_000_000))
    fallback(free, priced)
    engine = engines()
    replica(priced, engine.url)
    secret = key()
    Budget.objects.create(scope="key", key=ApiKey.objects.get(), amount_micros=100, spent_micros=100, period="day")
    answer = run(lambda app: call(app, CHAT, ask("free"), key=secret))
    assert answer.status == 429 and "is spent" in answer.json()["error"]["message"]
    assert engine.stats.requests == 0


def test_a_client_that_hangs_up_while_a_fallback_is_reserved_leaves_no_reservation(engines, monkeypatch):
    free = model("free")
    priced = model("priced", price=(1_000_000, 1_000_000))
    fallback(free, priced)
    engine = engines()
    replica(priced, engine.url)
    secret = key()
    Budget.objects.create(scope="key", key=ApiKey.objects.get(), amount_micros=10**9, period="day")
    moving = asyncio.Event()
    real_readmit = Gateway.readmit

    async def slow_readmit(self, *args):
        moving.set()
        await asyncio.sleep(0.2)  # the client hangs up in here
        return await real_readmit(self, *args)

    monkeypatch.setattr(Gateway, "readmit", slow_readmit)

    async def scenario(app):
        task = asyncio.ensure_future(call(app, CHAT, ask("free"), key=secret))
        await moving.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.4)  # the reservation lands after the client left

    run(scenario)
    record = UsageRecord.objects.get()
    assert (record.status, record.outcome) == (499, "client_disconnected")
    assert Budget.objects.get().reserved_micros == 0 and engine.stats.requests == 0
