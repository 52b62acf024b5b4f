"""Requests waiting for a cold start are demand: only those paid for and within their key's and team's cap count.

Through the real gateway on PostgreSQL: a model scaled to zero (no replica
ever becomes ready here, so every wait ends in its 503), a key whose budget
covers a few reservations, and thirty clients at once. What the autoscaler
decides from is the gateway's load report (``waiting``), sampled all along;
what starts a replica is the ``Demand`` row. With Redis, two gateway
processes share the cap (gateway.coldwait.Waiters).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections import Counter

import pytest
import redis
import redis.asyncio as aioredis

from gateway import tokens
from gateway.asgi import GatewayApp
from gateway.models import Budget
from gateway.proxy import Gateway
from gateway.writes import budgets, keys
from placement.models import Demand
from tests.gateway.harness import FAST, call, model

pytestmark = pytest.mark.django_db(transaction=True)

REDIS_URL = os.environ.get("LLMGW_TEST_GATEWAY_REDIS_URL", "redis://127.0.0.1:6379/14")
PRICE = (1_000_000, 4_000_000)  # micros per million prompt and completion tokens
BODY = {"model": "cold", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}
WAIT = dataclasses.replace(FAST, cold_start_timeout_s=1.5, cold_wait_per_key=3, cold_wait_per_team=100)


def reservation() -> int:
    """What one request of BODY reserves, by the gateway's own rule."""
    prompt = tokens.prompt_of(BODY)
    return budgets.cost_micros(prompt.bound(), tokens.completion_bound(BODY, prompt, "chat/completions", 1), PRICE)


def budgeted_key(team: str, covers: float) -> str:
    """A key of ``team`` whose budget covers ``covers`` reservations of BODY."""
    issued = keys.issue(team=team, org="acme")
    Budget.objects.create(scope="key", key=issued.key, amount_micros=int(reservation() * covers))
    return issued.secret


async def crowd(apps: list[GatewayApp], secrets: list[str], n: int) -> tuple[Counter, int]:
    """``n`` requests at once, spread over ``apps`` and ``secrets``: their answers' codes, and the most ever
    counted waiting at one moment over every app's load report (what the autoscaler reads)."""
    peak = 0
    done = asyncio.Event()

    async def watch() -> None:
        nonlocal peak
        while not done.is_set():
            counted = sum(a.gateway.load.report().get("cold", {}).get("waiting", 0) for a in apps if a.gateway)
            peak = max(peak, counted)
            await asyncio.sleep(0.005)

    watcher = asyncio.ensure_future(watch())
    answers = await asyncio.gather(
        *(call(apps[i % len(apps)], "/v1/chat/completions", BODY, key=secrets[i % len(secrets)]) for i in range(n))
    )
    done.set()
    await watcher
    codes = Counter(f"{a.status} {a.json()['error']['code']}" for a in answers)
    return codes, peak


def run(scenario, settings=WAIT, shared: bool = False):
    async def main():
        clients = [aioredis.from_url(REDIS_URL) for _ in range(2)] if shared else [None, None]
        apps = [GatewayApp(lambda c=c: Gateway(settings, c)) for c in clients]
        try:
            return await scenario(apps)
        finally:
            for app in apps:
                if app.gateway is not None:
                    waiters = getattr(app.gateway, "waiters", None)
                    left = dict(waiters.local) if waiters is not None else {}
                    await app.gateway.close()
                    assert not left, f"waiting places not given back: {left}"
            for c in clients:
                if c is not None:
                    await c.aclose()

    return asyncio.run(main())


def budget_left_alone() -> None:
    for b in Budget.objects.all():
        assert (b.spent_micros, b.reserved_micros) == (0, 0), "a wait that ends in 503 costs nothing"


def test_a_small_budget_sending_thirty_requests_raises_no_more_demand_than_it_could_pay_for_or_its_cap():
    model("cold", min_replicas=0, price=PRICE)
    secret = budgeted_key("search", covers=5.5)
    codes, peak = run(lambda apps: crowd(apps[:1], [secret], 30))
    assert peak <= 3, f"{peak} counted waiting: the key's cap is 3"
    assert codes["503 cold_start_timeout"] == peak == 3, codes
    assert codes["429 budget_exceeded"] > 0, "only five reservations fit the budget (more once some are given back)"
    assert codes["429 cold_wait_limit"] + codes["429 budget_exceeded"] == 27, codes
    assert Demand.objects.filter(model__name="cold").exists()
    budget_left_alone()


def test_a_key_that_cannot_pay_makes_nothing_start():
    model("cold", min_replicas=0, price=PRICE)
    secret = budgeted_key("search", covers=0.9)
    codes, peak = run(lambda apps: crowd(apps[:1], [secret], 30))
    assert codes == Counter({"429 budget_exceeded": 30}) and peak == 0
    assert not Demand.objects.exists(), "no request was paid for: none asked for a start"


def test_the_team_cap_holds_over_its_keys():
    model("cold", min_replicas=0, price=PRICE)
    secrets = [budgeted_key("search", covers=100) for _ in range(3)]
    settings = dataclasses.replace(WAIT, cold_wait_per_key=3, cold_wait_per_team=4)
    codes, peak = run(lambda apps: crowd(apps[:1], secrets, 30), settings)
    assert peak <= 4 and codes["503 cold_start_timeout"] == 4, codes
    refused = [c for c in codes if c.startswith("429")]
    assert refused == ["429 cold_wait_limit"] and codes["429 cold_wait_limit"] == 26


def test_the_refusal_says_which_cap_and_what_to_do():
    model("cold", min_replicas=0, price=PRICE)
    secret = budgeted_key("search", covers=100)

    async def scenario(apps):
        app = apps[0]
        first = [asyncio.ensure_future(call(app, "/v1/chat/completions", BODY, key=secret)) for _ in range(3)]
        await asyncio.sleep(0.5)
        late = await call(app, "/v1/chat/completions", BODY, key=secret)
        messages = await call(app, "/v1/messages", {**BODY, "max_tokens": 1}, key=secret)
        await asyncio.gather(*first)
        # Once the waits are over, the places are back: one more may wait.
        again = await call(app, "/v1/chat/completions", BODY, key=secret)
        return late, messages, again

    late, messages, again = run(scenario)
    assert late.status == 429 and late.headers["retry-after"] == "5"
    error = late.json()["error"]
    assert error["code"] == "cold_wait_limit" and error["type"] == "rate_limit_error"
    assert error["message"] == (
        "this key already has 3 requests waiting for a model to start (LLMGW_COLD_WAIT_PER_KEY); "
        "'cold' is not started for more: retry once it is ready"
    )
    assert messages.status == 429 and messages.json()["type"] == "error", "in the protocol's own shape"
    assert again.status == 503 and again.json()["error"]["code"] == "cold_start_timeout"


def test_two_gateway_processes_share_the_cap_through_redis():
    redis.Redis.from_url(REDIS_URL).flushdb()
    model("cold", min_replicas=0, price=PRICE)
    secret = budgeted_key("search", covers=100)
    codes, peak = run(lambda apps: crowd(apps, [secret], 20), shared=True)
    assert peak <= 3, f"{peak} counted waiting over two processes: the key's cap is 3"
    assert codes["503 cold_start_timeout"] == 3 and codes["429 cold_wait_limit"] == 17, codes
    left = redis.Redis.from_url(REDIS_URL)
    assert [k for k in left.scan_iter("llmgw:coldwait:*") if left.zcard(k)] == [], "every place given back"
    budget_left_alone()
