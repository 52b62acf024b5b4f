"""Budgets: reserve before, settle after; never overrun by more than what is in flight."""

from __future__ import annotations

import asyncio
import threading
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.utils import timezone

from gateway.asgi import GatewayApp
from gateway.models import Budget, Team, UsageRecord
from gateway.proxy import Gateway
from gateway.writes import budgets, keys
from gateway.writes.usage import Finished, write
from tests.gateway.harness import FAST, call, key, model, replica, settle

NOW = datetime(2026, 3, 18, 15, 30, tzinfo=UTC)  # a Wednesday


def test_cost_is_per_million_tokens_and_rounds_up():
    assert budgets.cost_micros(1_000_000, 0, (3_000_000, 0)) == 3_000_000
    assert budgets.cost_micros(1, 1, (1, 1)) == 1  # two millionths of a micro still cost one
    assert budgets.cost_micros(500, 100, None) == 0


def test_periods_start_at_midnight_monday_and_the_first():
    assert budgets.period_start("day", NOW) == datetime(2026, 3, 18, tzinfo=UTC)
    assert budgets.period_start("week", NOW) == datetime(2026, 3, 16, tzinfo=UTC)
    assert budgets.period_start("month", NOW) == datetime(2026, 3, 1, tzinfo=UTC)


def team_budget(amount: int, period: str = "day", **fields) -> Budget:
    key = keys.issue(team="search", org="acme").key
    return Budget.objects.create(scope="team", team=key.team, amount_micros=amount, period=period, **fields)


@pytest.mark.django_db
def test_reserve_refuses_what_the_budget_cannot_cover_and_names_the_budget():
    budget = team_budget(100, period_start=NOW)
    assert budgets.reserve([budget.id], 60, NOW) is None
    refusal = budgets.reserve([budget.id], 60, NOW)
    assert "daily budget of team 'search'" in refusal.sentence and "40 left" in refusal.sentence
    budgets.settle([(budget.id, 60, 100)], NOW)
    budget.refresh_from_db()
    assert (budget.spent_micros, budget.reserved_micros) == (100, 0)
    assert "is spent" in budgets.reserve([budget.id], 1, NOW).sentence


@pytest.mark.django_db
def test_all_budgets_or_none_are_reserved():
    key = keys.issue(team="search", org="acme").key
    roomy = Budget.objects.create(scope="org", org=key.team.org, amount_micros=1000, period_start=NOW)
    tight = Budget.objects.create(scope="key", key=key, amount_micros=10, period_start=NOW)
    refusal = budgets.reserve([roomy.id, tight.id], 50, NOW)
    assert refusal.budget_id == tight.id
    roomy.refresh_from_db()
    assert roomy.reserved_micros == 0


@pytest.mark.django_db
def test_a_new_period_starts_from_nothing_spent():
    budget = team_budget(100, period_start=NOW - timedelta(days=2), spent_micros=100)
    assert budgets.spent_now(budget, NOW) == 0
    assert budgets.reserve([budget.id], 80, NOW) is None
    budget.refresh_from_db()
    assert budget.spent_micros == 0 and budget.period_start == datetime(2026, 3, 18, tzinfo=UTC)


@pytest.mark.django_db(transaction=True)
def test_fifty_concurrent_reservations_never_take_more_than_the_budget():
    budget = team_budget(1000, period_start=timezone.now())
    now = timezone.now()
    granted = []
    start = threading.Barrier(50)

    def one() -> None:
        start.wait()
        if budgets.reserve([budget.id], 30, now) is None:
            granted.append(1)
        connection.close()

    threads = [threading.Thread(target=one) for _ in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    budget.refresh_from_db()
    assert len(granted) == 33  # 33 × 30 = 990; a 34th would be 1020
    assert budget.reserved_micros == 990


@pytest.mark.django_db
def test_usage_writes_settle_reservations_with_the_real_cost():
    budget = team_budget(1000, period_start=timezone.now())
    caller, _ = keys.authenticate(keys.issue(team="search").secret)
    assert caller.budget_ids == (budget.id,)
    assert budgets.reserve([budget.id], 300, timezone.now()) is None
    finished = Finished(
        at=timezone.now(),
        caller=caller,
        requested="m",
        model="m",
        replica_id="r",
        endpoint="chat/completions",
        stream=False,
        prompt_tokens=10,
        completion_tokens=20,
        counted_by="engine",
        cost_micros=42,
        status=200,
        outcome="ok",
        latency_ms=1.0,
        ttfb_ms=1.0,
        reserved=((budget.id, 300),),
    )
    write([finished])
    budget.refresh_from_db()
    assert (budget.reserved_micros, budget.spent_micros) == (0, 42)


@pytest.mark.django_db
def test_a_request_that_cost_more_than_it_reserved_leaves_every_next_request_refused():
    # No max_tokens, and the engine went past the default: charged in full,
    # and the budget refuses from then on (reserving needs spent < amount).
    budget = team_budget(200, period_start=NOW)
    assert budgets.reserve([budget.id], 100, NOW) is None
    budgets.settle([(budget.id, 100, 300)], NOW)
    budget.refresh_from_db()
    assert (budget.spent_micros, budget.reserved_micros) == (300, 0)
    assert "is spent" in budgets.reserve([budget.id], 1, NOW).sentence


@pytest.mark.django_db(transaction=True)
def test_requests_that_set_max_tokens_never_overrun_a_budget_whatever_the_script(engines):
    # An engine whose tokenizer makes a token of every byte of a CJK prompt:
    # four characters a token reserved a twelfth of it.
    engine = engines(prompt_count="bytes", honour_max_tokens=True)
    replica(model("llama", price=(1_000_000, 1_000_000)), engine.url)  # a micro a token
    secret = key()
    budget = Budget.objects.create(scope="team", team=Team.objects.get(), amount_micros=1_500, period="day")
    body = {"model": "llama", "max_tokens": 5, "messages": [{"role": "user", "content": "预算不能被超出" * 30}]}

    async def scenario():
        app = GatewayApp(lambda: Gateway(FAST))
        try:
            return [await call(app, "/v1/chat/completions", body, key=secret) for _ in range(4)]
        finally:
            await settle(app)

    answers = asyncio.run(scenario())
    budget.refresh_from_db()
    assert budget.spent_micros <= 1_500 and budget.reserved_micros == 0, [a.status for a in answers]
    assert answers[0].status == 200 and answers[-1].status == 429


@pytest.mark.django_db(transaction=True)
def test_a_request_the_engine_refuses_costs_nothing(engines):
    # Found by the hostile suite: an engine's 400 (a body it cannot serve) was charged the
    # gateway's own count of the prompt, though the engine generated and billed nothing.
    replica(model("llama", price=(1_000_000, 1_000_000)), engines(fail_status=400).url)
    secret = key()
    budget = Budget.objects.create(scope="team", team=Team.objects.get(), amount_micros=10**9, period="day")
    body = {"model": "llama", "messages": [{"role": "user", "content": "a prompt the engine refuses"}]}

    async def scenario():
        app = GatewayApp(lambda: Gateway(FAST))
        try:
            return await call(app, "/v1/chat/completions", body, key=secret)
        finally:
            await settle(app)

    assert asyncio.run(scenario()).status == 400
    budget.refresh_from_db()
    assert (budget.spent_micros, budget.reserved_micros) == (0, 0)
    record = UsageRecord.objects.get()
    assert (record.status, record.cost_micros, record.prompt_tokens) == (400, 0, 0)
