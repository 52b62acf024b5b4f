"""Rate limits shared by every gateway process: Redis when configured, the database otherwise."""

from __future__ import annotations

import asyncio
import os
import time

import pytest
import redis as sync_redis
import redis.asyncio as aioredis

from gateway import ratelimit
from gateway.models import ApiKey, RateWindow, Team
from gateway.writes import keys

REDIS_URL = os.environ.get("LLMGW_TEST_GATEWAY_REDIS_URL", "redis://127.0.0.1:6379/7")


def caller(key_rpm=None, key_tpm=None, team_rpm=None, team_tpm=None):
    issued = keys.issue(team="search", org="acme")
    ApiKey.objects.filter(pk=issued.key.pk).update(rpm=key_rpm, tpm=key_tpm)
    Team.objects.filter(name="search").update(rpm=team_rpm, tpm=team_tpm)
    return keys.authenticate(issued.secret)[0]


def test_the_window_slides():
    assert ratelimit.sliding(current=3, previous=10, fraction=0.75) == 3 + 2.5


@pytest.mark.django_db
def test_no_limits_cost_nothing():
    assert ratelimit.limits(caller()) == []


@pytest.mark.django_db
def test_in_the_database_requests_per_minute_hold_and_refusals_are_not_counted():
    c = caller(key_rpm=3)
    now = 1_000_000 * 60.0 + 1  # a second into a minute: the previous minute is all but whole
    checks = ratelimit.limits(c)
    assert [ratelimit.db_admit(checks, now, 10) for _ in range(3)] == [None, None, None]
    refusal = ratelimit.db_admit(checks, now, 10)
    assert "key's limit of 3 requests per minute" in refusal
    assert RateWindow.objects.get(scope=f"key:{c.key_id}", minute=1_000_000).requests == 3
    # At the next minute's turn they are all still inside the last sixty seconds...
    assert ratelimit.db_admit(checks, now + 59, 10) is not None
    # ...and fifty seconds into it, five sixths of them have slid out.
    assert ratelimit.db_admit(checks, now + 109, 10) is None


@pytest.mark.django_db
def test_in_the_database_tokens_are_held_at_admission_and_what_was_not_used_is_given_back():
    c = caller(team_tpm=100)
    now = 2_000_000 * 60.0
    checks = ratelimit.limits(c)
    assert ratelimit.db_admit(checks, now, 60) is None
    held = ratelimit.hold(checks, now, 60, in_redis=False)
    # Held, not yet used: a second request that may use 60 would pass the limit with the first.
    assert "team's limit of 100 tokens per minute is reached" in ratelimit.db_admit(checks, now + 1, 60)
    ratelimit.db_settle(held, 20)  # in the window it was held in, a minute later too
    assert RateWindow.objects.get(scope=f"team:{c.team_id}", minute=2_000_000).tokens == 20
    assert ratelimit.db_admit(checks, now + 1, 60) is None
    assert "team's limit of 100 tokens per minute is reached" in ratelimit.db_admit(checks, now + 2, 30)


@pytest.mark.django_db
def test_a_request_that_may_use_more_than_the_tpm_is_refused_saying_so_and_nothing_is_counted():
    c = caller(key_tpm=100, key_rpm=10)
    refusal = ratelimit.db_admit(ratelimit.limits(c), 3_000_000 * 60.0, 101)
    assert "may use up to 101 tokens" in refusal and "limit of 100 tokens per minute" in refusal
    assert "lower max_tokens" in refusal
    assert RateWindow.objects.get().requests == 0 and RateWindow.objects.get().tokens == 0


@pytest.fixture
def redis_db():
    client = sync_redis.Redis.from_url(REDIS_URL)
    try:
        client.ping()
    except sync_redis.ConnectionError:
        pytest.skip(f"no Redis at {REDIS_URL}")
    client.flushdb()
    yield
    client.flushdb()


@pytest.mark.django_db(transaction=True)
def test_with_redis_every_process_shares_the_count(redis_db):
    c = caller(key_rpm=5, team_tpm=50)

    async def scenario():
        # Two limiters stand for two gateway processes.
        first = ratelimit.Limiter(None, aioredis.from_url(REDIS_URL))
        second = ratelimit.Limiter(None, aioredis.from_url(REDIS_URL))
        answers = [await (first if i % 2 else second).admit(c, 8) for i in range(6)]
        for i, (_, held) in enumerate(answers[:5]):
            await (first if i % 2 else second).settle(held, 2)  # each held 8 and used 2
        return answers

    answers = asyncio.run(scenario())
    assert [why for why, _ in answers[:5]] == [None] * 5 and "5 requests per minute" in answers[5][0]
    assert answers[5][1] is None  # a refused request holds nothing
    client = sync_redis.Redis.from_url(REDIS_URL)
    assert sum(int(client.get(k)) for k in client.keys(f"llmgw:rl:team:{c.team_id}:*:t")) == 5 * 2


@pytest.mark.django_db(transaction=True)
def test_with_redis_tokens_are_held_at_admission_and_settled_where_they_were_held(redis_db):
    c = caller(team_tpm=100)

    async def scenario():
        limiter = ratelimit.Limiter(None, aioredis.from_url(REDIS_URL))
        why, held = await limiter.admit(c, 70)
        second = await limiter.admit(c, 70)
        await limiter.settle(held, 10)
        third = await limiter.admit(c, 70)
        return why, held, second, third

    why, held, second, third = asyncio.run(scenario())
    assert why is None and held.in_redis and held.tokens == 70 and held.scopes == (f"team:{c.team_id}",)
    assert "tokens per minute is reached" in second[0]
    assert third[0] is None
    client = sync_redis.Redis.from_url(REDIS_URL)
    assert int(client.get(f"llmgw:rl:team:{c.team_id}:{held.minute}:t")) == 80


@pytest.mark.django_db(transaction=True)
def test_when_redis_is_down_the_database_counts():
    c = caller(key_rpm=1)
    used = []

    async def run_db(fn, *args):
        used.append(fn.__name__)
        return await asyncio.to_thread(_closing(fn), *args)

    async def scenario():
        limiter = ratelimit.Limiter(run_db, aioredis.from_url("redis://127.0.0.1:1/0", socket_connect_timeout=0.2))
        return await limiter.admit(c, 5), await limiter.admit(c, 5)

    started = time.monotonic()
    (first, _), (second, _) = asyncio.run(scenario())
    assert first is None and "1 requests per minute" in second
    assert used == ["db_admit", "db_admit"] and time.monotonic() - started < 5


def _closing(fn):
    def call(*args):
        from django.db import connection

        try:
            return fn(*args)
        finally:
            connection.close()

    return call


@pytest.mark.django_db(transaction=True)
def test_the_usage_writer_forgets_windows_nothing_reads_again():
    from gateway.writes.usage import Writer

    minute = int(time.time() // 60)
    for m in (minute - 10, minute - 3, minute - 1, minute):
        RateWindow.objects.create(scope="key:x", minute=m, requests=1)

    async def prune():
        loop = asyncio.get_running_loop()

        async def run_db(fn, *args):
            return await loop.run_in_executor(None, fn, *args)

        await Writer(run_db, 1.0, 1.0).prune()

    asyncio.run(prune())
    # The previous minute still counts in the sliding window; older ones never will.
    assert sorted(RateWindow.objects.values_list("minute", flat=True)) == [minute - 1, minute]
