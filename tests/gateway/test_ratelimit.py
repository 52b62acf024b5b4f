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
    assert [ratelimit.db_admit(checks, now) for _ in range(3)] == [None, None, None]
    refusal = ratelimit.db_admit(checks, now)
    assert "key's limit of 3 requests per minute" in refusal
    assert RateWindow.objects.get(scope=f"key:{c.key_id}", minute=1_000_000).requests == 3
    # At the next minute's turn they are all still inside the last sixty seconds...
    assert ratelimit.db_admit(checks, now + 59) is not None
    # ...and fifty seconds into it, five sixths of them have slid out.
    assert ratelimit.db_admit(checks, now + 109) is None


@pytest.mark.django_db
def test_in_the_database_tokens_per_minute_count_what_requests_used():
    c = caller(team_tpm=100)
    now = 2_000_000 * 60.0
    checks = ratelimit.limits(c)
    assert ratelimit.db_admit(checks, now) is None
    ratelimit.db_spend([f"team:{c.team_id}"], 100, now)
    assert "team's limit of 100 tokens per minute" in ratelimit.db_admit(checks, now + 1)


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
        answers = [await (first if i % 2 else second).admit(c) for i in range(6)]
        await first.spend(c, 60)
        after_tokens = await second.admit(c)
        return answers, after_tokens

    answers, after_tokens = asyncio.run(scenario())
    assert answers[:5] == [None] * 5 and "5 requests per minute" in answers[5]
    assert after_tokens is not None


@pytest.mark.django_db(transaction=True)
def test_when_redis_is_down_the_database_counts():
    c = caller(key_rpm=1)
    used = []

    async def run_db(fn, *args):
        used.append(fn.__name__)
        return await asyncio.to_thread(_closing(fn), *args)

    async def scenario():
        limiter = ratelimit.Limiter(run_db, aioredis.from_url("redis://127.0.0.1:1/0", socket_connect_timeout=0.2))
        return await limiter.admit(c), await limiter.admit(c)

    started = time.monotonic()
    first, second = asyncio.run(scenario())
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
