"""The request path's queries made from the event loop (PostgreSQL) decide as the ORM's path does."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest
from django.db import connections
from django.utils import timezone

from gateway import admission
from gateway.asgi import GatewayApp
from gateway.models import ApiKey, Budget, Lease, RateWindow, Team, UsageHour, UsageRecord
from gateway.pgpath import PgPath, connection_params
from gateway.proxy import Gateway
from gateway.rules import Ask
from gateway.writes import keys, leases
from gateway.writes.usage import ROWS_PER_INSERT, Finished, statements, write
from gateway.writes.usage import copy as usage_copy
from tests.gateway.harness import FAST, call, model, replica, settle

pytestmark = pytest.mark.django_db(transaction=True)


def on_loop(scenario):
    """Run ``scenario(pg)`` in a fresh loop, with an ORM thread for the rare paths; its connections closed after."""
    orm = ThreadPoolExecutor(1)

    async def main():
        loop = asyncio.get_running_loop()

        async def run_db(fn, *args):
            return await loop.run_in_executor(orm, fn, *args)

        pg = PgPath.for_database(4, run_db)
        try:
            return await scenario(pg)
        finally:
            await pg.close()

    try:
        return asyncio.run(main())
    finally:
        orm.submit(connections.close_all).result()
        orm.shutdown()


def outcome(result: admission.Admission):
    refused = result.refused
    return (
        result.caller.key_id if result.caller else None,
        (refused.status, refused.code, refused.message) if refused else None,
        result.reserved,
    )


def held(budget: Budget, micros: int) -> Budget:
    """``budget`` with ``micros`` reserved by this process, as its requests in flight would hold them."""
    Budget.objects.filter(pk=budget.pk).update(reserved_micros=micros)
    Lease.objects.create(owner=leases.owner(), budget=budget, micros=micros, expires_at=timezone.now())
    budget.refresh_from_db()
    return budget


def reset() -> None:
    Budget.objects.update(reserved_micros=0, spent_micros=0)
    RateWindow.objects.all().delete()


def test_every_decision_matches_the_orms():
    plain = keys.issue(team="search", org="acme")
    narrow = keys.issue(team="search", org="acme", models=["small"])
    revoked = keys.issue(team="search", org="acme")
    keys.revoke(revoked.key)
    limited = keys.issue(team="ads", org="acme")
    ApiKey.objects.filter(pk=limited.key.pk).update(rpm=1)
    tight = keys.issue(team="tight", org="other")
    Budget.objects.create(scope="org", org=tight.key.team.org, amount_micros=10_000)
    Budget.objects.create(scope="team", team=tight.key.team, amount_micros=1_000)
    Budget.objects.create(scope="key", key=tight.key, amount_micros=10_000)
    Budget.objects.create(scope="team", team=Team.objects.get(name="search"), amount_micros=5_000)
    now = timezone.now()
    cases = [
        ("", "big", 10, True),
        ("sk-llmgw-nonsense", "big", 10, True),
        (revoked.secret, "big", 10, True),
        (narrow.secret, "big", 10, True),
        (narrow.secret, "small", 10, True),
        (plain.secret, "big", None, True),
        (plain.secret, "big", 4_000, True),
        (plain.secret, "big", 6_000, True),
        (tight.secret, "big", 900, True),
        (tight.secret, "big", 2_000, True),
        (limited.secret, "big", None, True),
        (limited.secret, "big", None, False),
    ]
    for secret, name, estimate, db_limits in cases:
        args = (secret, Ask(name, name, (), estimate, db_limits, now))
        reset()
        by_orm = [outcome(admission.admit(*args)) for _ in range(2)]
        reset()

        async def twice(pg, args=args):
            return [outcome(await pg.admit(*args)) for _ in range(2)]

        assert on_loop(twice) == by_orm, (secret[:12], name, estimate, db_limits)
    # A refused reservation on three budgets leaves nothing held on the others.
    reset()
    on_loop(lambda pg: pg.admit(tight.secret, Ask("big", "big", (), 2_000, True, now)))
    assert sorted(Budget.objects.values_list("reserved_micros", flat=True)) == [0, 0, 0, 0]


def test_fifty_concurrent_admissions_never_take_more_than_the_budget():
    issued = keys.issue(team="search", org="acme")
    budget = Budget.objects.create(scope="team", team=issued.key.team, amount_micros=1000)
    now = timezone.now()

    async def fifty(pg):
        return await asyncio.gather(*(pg.admit(issued.secret, Ask("m", "m", (), 30, True, now)) for _ in range(50)))

    results = on_loop(fifty)
    granted = [r for r in results if r.refused is None]
    refused = [r for r in results if r.refused is not None]
    budget.refresh_from_db()
    assert len(granted) == 33 and budget.reserved_micros == 990  # a 34th would be 1020
    assert all(r.refused.status == 429 and "team 'search'" in r.refused.message for r in refused)


def test_a_connection_the_server_closed_is_replaced_without_failing_the_request():
    issued = keys.issue(team="search", org="acme")

    async def scenario(pg):
        first = await pg.authenticate(issued.secret)
        (idle,) = pg._idle
        async with await psycopg.AsyncConnection.connect(**connection_params()) as killer:
            await killer.execute("SELECT pg_terminate_backend(%s)", [idle.info.backend_pid])
        await asyncio.sleep(0.1)
        second = await pg.authenticate(issued.secret)
        return first, second, idle

    first, second, idle = on_loop(scenario)
    assert first.caller is not None and second.caller == first.caller
    assert idle.closed


def test_a_request_cancelled_mid_query_does_not_give_its_connection_back():
    async def scenario(pg):
        with pytest.raises(asyncio.CancelledError):
            async with pg._connection() as conn:
                raise asyncio.CancelledError
        return conn, list(pg._idle)

    conn, idle = on_loop(scenario)
    assert conn.closed and idle == []


def test_the_loop_paths_connections_do_not_wait_for_the_disk():
    async def scenario(pg):
        async with pg._connection() as conn:
            cursor = await conn.execute("SHOW synchronous_commit")
            return (await cursor.fetchone())[0]

    assert on_loop(scenario) == "off"


def test_prepared_statements_follow_the_databases_options():
    # psycopg's default unless the database's OPTIONS say otherwise (None for
    # a PgBouncer too old to keep prepared statements in transaction mode).
    assert connection_params()["prepare_threshold"] == 5
    options = connections["default"].settings_dict["OPTIONS"]
    options["prepare_threshold"] = None
    try:
        assert connection_params()["prepare_threshold"] is None
    finally:
        options.pop("prepare_threshold")


def finished(caller, n: int, reserved: int = 0) -> list[Finished]:
    at = timezone.now()
    return [
        Finished(
            at=at,
            caller=caller,
            requested="alias",
            model="big",
            replica_id="r1",
            endpoint="chat/completions",
            stream=bool(i % 2),
            prompt_tokens=10 + i,
            completion_tokens=20,
            counted_by="engine" if i % 3 else "llmgw",
            cost_micros=7,
            status=200 if i % 5 else 499,
            outcome="ok" if i % 5 else "client_disconnected",
            latency_ms=1.23456,
            ttfb_ms=None if i % 2 else 0.5,
            reserved=tuple((b, reserved) for b in caller.budget_ids),
        )
        for i in range(n)
    ]


def written(key_id: str) -> tuple:
    fields = (
        "requested",
        "model",
        "stream",
        "prompt_tokens",
        "counted_by",
        "status",
        "outcome",
        "latency_ms",
        "ttfb_ms",
    )
    records = sorted(UsageRecord.objects.filter(key_id=key_id).values_list(*fields))
    hours = list(
        UsageHour.objects.filter(key_id=key_id).values_list("requests", "errors", "prompt_tokens", "cost_micros")
    )
    return records, hours


def test_usage_written_from_the_loop_is_what_the_orms_writer_writes():
    # More records than one INSERT takes, so the batch is split.
    count = ROWS_PER_INSERT * 2 + 7
    by_orm, on_loop_key = keys.issue(team="a", org="acme"), keys.issue(team="b", org="acme")
    orm_budget = held(Budget.objects.create(scope="key", key=by_orm.key, amount_micros=10**9), count * 50)
    loop_budget = held(Budget.objects.create(scope="key", key=on_loop_key.key, amount_micros=10**9), count * 50)
    orm_caller, _ = keys.authenticate(by_orm.secret)
    loop_caller, _ = keys.authenticate(on_loop_key.secret)
    write(finished(orm_caller, count, reserved=50))

    async def scenario(pg):
        # As the gateway writes on the loop: the records copied, the rest as statements.
        batch = finished(loop_caller, count, reserved=50)
        await pg.write(statements(batch, timezone.now(), records=False), copy=usage_copy(batch))

    on_loop(scenario)
    assert written(by_orm.key.id) == written(on_loop_key.key.id)
    assert len(written(by_orm.key.id)[0]) == count
    orm_budget.refresh_from_db()
    loop_budget.refresh_from_db()
    assert (orm_budget.reserved_micros, orm_budget.spent_micros) == (0, count * 7)
    assert (loop_budget.reserved_micros, loop_budget.spent_micros) == (0, count * 7)


def test_a_batch_the_database_refuses_is_written_whole_or_not_at_all():
    issued = keys.issue(team="a", org="acme")
    Budget.objects.create(scope="key", key=issued.key, amount_micros=10**9, reserved_micros=500)
    caller, _ = keys.authenticate(issued.secret)
    batch = finished(caller, 3, reserved=100)
    batch[-1].requested = "x" * 500  # longer than the column: the INSERT fails

    async def scenario(pg):
        with pytest.raises(psycopg.DataError):
            await pg.write(statements(batch, timezone.now(), records=False), copy=usage_copy(batch))
        with pytest.raises(psycopg.DataError):
            await pg.write(statements(batch, timezone.now()))

    on_loop(scenario)
    assert not UsageRecord.objects.exists() and not UsageHour.objects.exists()
    assert Budget.objects.get().reserved_micros == 500


def test_after_the_server_ends_every_idle_connection_the_next_requests_reserve_once_each():
    issued = keys.issue(team="search", org="acme")
    budget = Budget.objects.create(scope="team", team=issued.key.team, amount_micros=10_000)
    now = timezone.now()

    async def scenario(pg):
        # Three connections in the pool, then a restart's worth of terminations.
        await asyncio.gather(*(pg.admit(issued.secret, Ask("m", "m", (), 10, True, now)) for _ in range(3)))
        pids = [c.info.backend_pid for c in pg._idle]
        async with await psycopg.AsyncConnection.connect(**connection_params()) as admin:
            for pid in pids:
                await admin.execute("SELECT pg_terminate_backend(%s)", [pid])
        await asyncio.sleep(0.2)
        return [await pg.admit(issued.secret, Ask("m", "m", (), 10, True, now)) for _ in range(4)], len(pids)

    after, pooled = on_loop(scenario)
    assert pooled >= 1
    assert all(a.refused is None and a.reserved == ((budget.id, 10),) for a in after)
    budget.refresh_from_db()
    assert budget.reserved_micros == 70  # 3 before, 4 after: none twice, none lost


def test_a_database_that_does_not_answer_is_a_503_that_says_so(engines):
    replica(model("llama", price=(1, 1)), engines().url)
    secret = keys.issue(team="search", org="acme").secret

    async def scenario():
        gateway = Gateway(FAST)
        gateway.pg.params = {**gateway.pg.params, "port": 1, "connect_timeout": 1}
        app = GatewayApp(lambda: gateway)
        answer = await call(
            app, "/v1/chat/completions", {"model": "llama", "messages": [{"role": "user", "content": "hi"}]}, key=secret
        )
        await settle(app)
        return answer

    answer = asyncio.run(scenario())
    connections.close_all()
    error = answer.json()["error"]
    assert answer.status == 503 and error["code"] == "database_unavailable"
    assert "database did not answer" in error["message"] and "nothing was sent to an engine" in error["message"]
    assert answer.headers["retry-after"] == "5" and "try again in 5 s" in error["message"]
