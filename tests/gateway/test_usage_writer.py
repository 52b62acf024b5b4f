"""Usage is written whatever an engine reports and whatever the database refuses: one bad record blocks nothing."""

from __future__ import annotations

import asyncio
import logging
import math
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import OperationalError, connection, connections
from django.utils import timezone
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from core.models import ApiToken
from gateway.models import ApiKey, Budget, Lease, SetAsideUsage, UsageHour, UsageRecord
from gateway.pgpath import PgPath
from gateway.writes import keys, leases
from gateway.writes.usage import MAX_TOKENS, Finished, Writer, engine_count, engine_usage, statements
from gateway.writes.usage import copy as usage_copy
from tests import people
from tests.gateway import fake_engine
from tests.gateway.harness import call, key, model, new_app, replica, settle

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=6,
)


@given(JSON)
def test_an_engines_count_is_taken_only_as_a_whole_number_a_record_can_hold(value):
    count = engine_count(value)
    assert count is None or (type(count) is int and 0 <= count <= MAX_TOKENS)
    if isinstance(value, bool) or (isinstance(value, int | float) and not 0 <= value <= MAX_TOKENS):
        assert count is None
    if type(value) is int and 0 <= value <= MAX_TOKENS:
        assert count == value


@pytest.mark.parametrize("bad", [-1, 2**31, True, 1.5, math.nan, math.inf, "7", None])
def test_usage_with_any_count_that_is_not_one_is_not_taken(bad):
    assert engine_usage((bad, 3)) is None and engine_usage((3, bad)) is None
    assert engine_usage((3, 4)) == (3, 4) and engine_usage((2.0, 0)) == (2, 0)


@pytest.mark.django_db
def test_the_bound_on_counts_is_the_columns():
    low, high = connection.ops.integer_field_range("PositiveIntegerField")
    for name in ("prompt_tokens", "completion_tokens"):
        assert UsageRecord._meta.get_field(name).get_internal_type() == "PositiveIntegerField"
    assert (low, high) == (0, MAX_TOKENS)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("reported", [-7, 2**31, True])
def test_a_count_an_engine_makes_up_is_replaced_by_llmgws_own_and_usage_goes_on(engines, monkeypatch, reported):
    # The fake engine reports this as the prompt's tokens in its usage.
    monkeypatch.setattr(fake_engine, "prompt_tokens", lambda body, count="words": reported)
    m = model("llama", price=(1_000_000, 1_000_000))
    replica(m, engines(tokens=3).url)
    secret = key()
    Budget.objects.create(scope="key", key=ApiKey.objects.get(), amount_micros=10**9, period="day")

    async def scenario():
        app = new_app()
        try:
            return [await call(app, "/v1/chat/completions", hello(), key=secret) for _ in range(3)]
        finally:
            await settle(app)

    answers = asyncio.run(scenario())
    assert [a.status for a in answers] == [200, 200, 200]
    records = list(UsageRecord.objects.values_list("prompt_tokens", "completion_tokens", "counted_by"))
    # Counted by llmgw (the prompt by /tokenize, a token a word; the answer at four characters a token): all written.
    assert records == [(5, 2, "llmgw")] * 3
    budget = Budget.objects.get()
    assert budget.reserved_micros == 0 and not Lease.objects.exclude(micros=0).exists()


def hello() -> dict:
    return {"model": "llama", "messages": [{"role": "user", "content": "say hello to everyone here"}]}


# --- a record the database refuses ------------------------------------------------


def finished(caller, n: int, reserved: int, **change) -> list[Finished]:
    now = timezone.now()
    out = []
    for i in range(n):
        f = Finished(
            at=now,
            caller=caller,
            requested="llama",
            model="llama",
            replica_id="r1",
            endpoint="chat/completions",
            stream=False,
            prompt_tokens=5,
            completion_tokens=i,
            counted_by="engine",
            cost_micros=10,
            status=200,
            outcome="ok",
            latency_ms=1.5,
            ttfb_ms=None,
            reserved=tuple((b, reserved) for b in caller.budget_ids),
        )
        out.append(f)
    for name, value in change.items():
        setattr(out[n // 2], name, value)
    return out


def reserved_by_this_process(budget: Budget, micros: int) -> None:
    Budget.objects.filter(pk=budget.pk).update(reserved_micros=micros)
    Lease.objects.create(owner=leases.owner(), budget=budget, micros=micros, expires_at=timezone.now())


def write_through_a_writer(batch, on_loop: bool) -> Writer:
    """Flush ``batch`` as the gateway's writer does: by the ORM on its thread, or on the loop (PostgreSQL)."""
    orm = ThreadPoolExecutor(1)

    async def main():
        loop = asyncio.get_running_loop()

        async def run_db(fn, *args):
            return await loop.run_in_executor(orm, fn, *args)

        pg = PgPath.for_database(2, run_db) if on_loop else None

        async def on_the_loop(part):
            await pg.write(statements(part, timezone.now(), records=False), copy=usage_copy(part))

        writer = Writer(run_db, 10, 10, write_batch=on_the_loop if on_loop else None)
        for f in batch:
            writer.add(f)
        try:
            await writer.flush()
        finally:
            if pg is not None:
                await pg.close()
        return writer

    try:
        return asyncio.run(main())
    finally:
        orm.submit(connections.close_all).result()
        orm.shutdown()


WRITERS = [pytest.param(False, id="orm"), pytest.param(True, id="loop")]
BAD = [
    pytest.param({"prompt_tokens": 2**31}, id="tokens-past-the-column"),
    pytest.param({"completion_tokens": -1}, id="negative-tokens"),
    pytest.param({"latency_ms": math.nan, "status": 70000}, id="status-past-the-column"),
]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("on_loop", WRITERS)
@pytest.mark.parametrize("bad", BAD)
def test_one_record_the_database_refuses_is_set_aside_and_every_other_is_written(on_loop, bad, caplog):
    issued = keys.issue(team="search", org="acme")
    budget = Budget.objects.create(scope="key", key=issued.key, amount_micros=10**9)
    caller, _ = keys.authenticate(issued.secret)
    batch = finished(caller, 9, reserved=100, **bad)
    reserved_by_this_process(budget, 900)

    with caplog.at_level(logging.ERROR, logger="llmgw.gateway"):
        writer = write_through_a_writer(batch, on_loop)

    assert UsageRecord.objects.count() == 8 and writer.queue == [] and writer.set_aside == 1
    assert UsageHour.objects.get().requests == 8
    kept = SetAsideUsage.objects.get()
    assert kept.reason and '"caller"' in kept.record
    # The set-aside record's reservation is back too, and what it cost is charged.
    budget.refresh_from_db()
    assert (budget.reserved_micros, budget.spent_micros) == (0, 90)
    assert Lease.objects.get().micros == 0
    set_aside_lines = [r for r in caplog.records if "set aside" in r.getMessage()]
    assert len(set_aside_lines) == 1 and not any(r.exc_info for r in caplog.records)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("on_loop", WRITERS)
def test_a_record_of_a_key_deleted_meanwhile_is_set_aside(on_loop):
    kept, gone = keys.issue(team="a", org="acme"), keys.issue(team="b", org="acme")
    kept_caller, _ = keys.authenticate(kept.secret)
    gone_caller, _ = keys.authenticate(gone.secret)
    ApiKey.objects.filter(pk=gone.key.pk).delete()
    batch = finished(kept_caller, 4, reserved=0) + finished(gone_caller, 1, reserved=0) + finished(kept_caller, 3, 0)

    writer = write_through_a_writer(batch, on_loop)

    assert UsageRecord.objects.count() == 7 and writer.queue == []
    assert SetAsideUsage.objects.count() == 1 and gone.key.id in SetAsideUsage.objects.get().record


@pytest.mark.django_db(transaction=True)
def test_a_database_that_is_away_sets_nothing_aside_and_keeps_the_batch():
    issued = keys.issue(team="search", org="acme")
    caller, _ = keys.authenticate(issued.secret)
    batch = finished(caller, 5, reserved=0)

    async def main():
        async def run_db(fn, *args):
            raise OperationalError("the database is away")

        writer = Writer(run_db, 10, 10)
        for f in batch:
            writer.add(f)
        with pytest.raises(OperationalError):
            await writer.flush()
        return writer

    writer = asyncio.run(main())
    assert writer.queue == batch and writer.set_aside == 0
    assert not SetAsideUsage.objects.exists()


@pytest.mark.django_db
def test_set_aside_records_are_counted_on_metrics(client, django_user_model):
    SetAsideUsage.objects.create(reason="DataError: integer out of range", record="{}")
    SetAsideUsage.objects.create(reason="IntegrityError: key gone", record="{}")
    user = people.person("prom", "viewers")
    _, token = ApiToken.issue(user, "prometheus", read_only=True)
    text = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {token}").content.decode()
    samples = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    assert samples["llmgw_gateway_usage_records_set_aside_total"] == 2
