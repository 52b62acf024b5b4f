"""This gateway worker's load per model, counted on the request path and published every second.

What the autoscaler decides from (``placement.writes.load`` says where it
is kept and how every worker's is summed): per model, requests in flight on
a replica, requests waiting for one to be ready, completion tokens per
second and the mean time to the first token of what ended in the last
``WINDOW_S`` seconds. Tokens are counted when a request ends, so a long
stream shows in tokens per second once it is over; in flight counts it all
along.

Published to Redis when the gateway has it, as one hash with a time to
live; when Redis is not configured or does not answer, to the database,
and then only when the figures changed or half the time to live has gone,
so an idle worker writes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter, deque

from django.utils import timezone

from core import outage
from gateway.writes import leases
from placement.writes import load as shared

log = logging.getLogger("llmgw.gateway")
WINDOW_S = 10.0
PUBLISH_EVERY_S = 1.0


class LoadMeter:
    """Counters for one worker; every method is called on the event loop."""

    def __init__(self) -> None:
        self.in_flight: Counter[str] = Counter()
        self.waiting: Counter[str] = Counter()
        self.ended: deque[tuple[float, str, int, float | None]] = deque()

    def enter(self, model: str) -> None:
        self.in_flight[model] += 1

    def leave(self, model: str) -> None:
        self.in_flight[model] -= 1
        if self.in_flight[model] <= 0:
            del self.in_flight[model]

    def wait(self, model: str) -> None:
        self.waiting[model] += 1

    def waited(self, model: str) -> None:
        self.waiting[model] -= 1
        if self.waiting[model] <= 0:
            del self.waiting[model]

    def finished(self, model: str, completion_tokens: int, ttft_ms: float | None, now: float | None = None) -> None:
        self.ended.append((time.monotonic() if now is None else now, model, max(0, completion_tokens), ttft_ms))

    def report(self, now: float | None = None) -> dict[str, dict]:
        """Per model with anything to say: in flight, waiting, tokens per second and time to first token."""
        now = time.monotonic() if now is None else now
        while self.ended and self.ended[0][0] < now - WINDOW_S:
            self.ended.popleft()
        tokens: Counter[str] = Counter()
        firsts: dict[str, list[float]] = {}
        for _t, model, n, ttft in self.ended:
            tokens[model] += n
            if ttft is not None:
                firsts.setdefault(model, []).append(ttft)
        out = {}
        for model in sorted(set(self.in_flight) | set(self.waiting) | {e[1] for e in self.ended}):
            ttfts = firsts.get(model)
            out[model] = {
                "in_flight": self.in_flight.get(model, 0),
                "waiting": self.waiting.get(model, 0),
                "tokens_per_s": round(tokens.get(model, 0) / WINDOW_S, 3),
                "ttft_ms": round(sum(ttfts) / len(ttfts), 1) if ttfts else None,
            }
        return out


class Publisher:
    """Publishes a meter's report every second: to Redis, or to the database when Redis is absent or fails."""

    def __init__(self, meter: LoadMeter, run_db, redis=None, every_s: float = PUBLISH_EVERY_S) -> None:
        self.meter = meter
        self.run_db = run_db
        self.redis = redis
        self.every_s = every_s
        self._task: asyncio.Task | None = None
        self._in_db = False
        self._last_db: tuple[dict, float] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.ensure_future(self._loop())

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.every_s)
            try:
                await self.publish()
            except Exception as exc:  # noqa: BLE001 - the next second tries again; the load is advisory
                log.warning("gateway: publishing the load failed: %s", exc)

    async def publish(self) -> str:
        """Publish once; says where to: ``redis``, ``database``, or ``nothing`` (the database needed no write)."""
        report = self.meter.report()
        owner = leases.owner()
        if self.redis is not None:
            try:
                await self._to_redis(owner, report)
            except Exception as exc:  # noqa: BLE001 - any Redis failure: the database keeps the load
                outage.redis.failed(exc)
            else:
                outage.redis.back()
                if self._in_db:
                    await self.run_db(shared.forget, owner)
                    self._in_db, self._last_db = False, None
                return "redis"
        return await self._to_database(owner, report)

    async def _to_redis(self, owner: str, report: dict[str, dict]) -> None:
        key = shared.redis_key(owner)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.delete(key)
            if report:
                pipe.hset(key, mapping=shared.encode(report, time.time()))
                pipe.expire(key, int(shared.LOAD_TTL_S))
            await pipe.execute()

    async def _to_database(self, owner: str, report: dict[str, dict]) -> str:
        now = time.monotonic()
        if not report and not self._in_db:
            return "nothing"
        if self._last_db is not None and self._last_db[0] == report and now - self._last_db[1] < shared.LOAD_TTL_S / 2:
            return "nothing"
        await self.run_db(shared.store, owner, report, timezone.now())
        self._in_db, self._last_db = bool(report), (report, now)
        return "database"

    async def close(self) -> None:
        """Stop publishing and take this worker's load away (it serves nothing any more)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        owner = leases.owner()
        if self.redis is not None:
            with contextlib.suppress(Exception):
                await self.redis.delete(shared.redis_key(owner))
        if self._in_db:
            with contextlib.suppress(Exception):
                await self.run_db(shared.forget, owner)
            self._in_db = False
