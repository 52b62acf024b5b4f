"""The gateway's side of a cold start: ask placement for a replica, wait for it within the bound, say why not.

A request for a model with no ready replica and ``on_demand`` set holds a
waiting place (gateway.coldwait) and the reservation of the model it waits
for, asks for a replica at most once a second per model, and polls the
directory until one is ready or LLMGW_COLD_START_TIMEOUT_S has passed; the
503 it gets then carries ``Retry-After`` from the start's estimate
(placement.starts.cold_start). :class:`ColdStart` is a part of
gateway.proxy.Gateway, which it is mixed into.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time

from django.db import InterfaceError, OperationalError

from core import tracing
from gateway import (
    coldwait,
    errors,
)
from gateway.directory import ModelEntry, Snapshot
from placement import starts as placement_starts
from placement.writes import demand

log = logging.getLogger("llmgw.gateway")

# How often one model may be asked for again while it is starting.
DEMAND_EVERY_S = 1.0
COLD_POLL_S = 0.5
# How long one read of a model's start serves every request waiting for it.
START_STATUS_TTL_S = 1.0


class ColdStart:
    """Gateway's methods for a model that has no ready replica yet."""

    async def _serve_cold(self, ticket, entry, fallbacks, body, prefix, attempts, slot, send) -> None:
        """Wait for ``entry``'s start holding ``slot``, then serve it; raises why it could not be served.

        Only a request that may wait, and that holds the reservation of the
        model it waits for, is counted as waiting (the autoscaler's demand):
        one past its key's or team's cap is refused here, and a fallback tried
        before may have moved the reservation to its own price.
        """
        tried, failures = attempts
        if slot.refused is not None:
            raise slot.refused
        await self._hold(ticket, entry)
        cold = coldwait.ColdStream(ticket.endpoint, entry.name, send) if ticket.stream else None
        self.load.wait(entry.serving)
        try:
            with tracing.span("gateway.wait_for_replica", {"llmgw.model": entry.name}):
                snapshot = await self._wait_for_replica(entry, ticket.started, cold)
            relay = cold.send if cold is not None and cold.committed else send
        except errors.Refused as refusal:
            if cold is not None and cold.committed:
                await cold.fail(refusal)
            raise
        finally:
            self.load.waited(entry.serving)
            self._give_back(slot)
        try:
            if await self._try_model(ticket, entry, snapshot, body, prefix, tried, failures, relay):
                if cold is not None and cold.committed and not cold.ended:
                    await cold.fail(errors.upstream_failed("the engine's answer ended without its end"))
                return
            self._no_replica(entry, fallbacks, failures)
        except errors.Refused as refusal:
            if cold is not None and cold.committed:
                await cold.fail(refusal)
            raise

    def _give_back(self, slot: coldwait.Slot | None) -> None:
        """Give a waiting place back: at once in this process, in Redis as background work ``close`` waits for."""
        call = self.waiters.release(slot)
        if call is not None:
            task = asyncio.ensure_future(call)
            self.background.add(task)
            task.add_done_callback(self.background.discard)

    async def _demand(self, entry: ModelEntry) -> None:
        """Ask placement for a replica (placement.writes.demand), at most once every DEMAND_EVERY_S per model."""
        now = time.monotonic()
        if now - self._demanded.get(entry.serving, -DEMAND_EVERY_S) < DEMAND_EVERY_S:
            return
        self._demanded[entry.serving] = now
        await self.run_db(demand.request_replica, entry.serving)

    async def _start_status(self, entry: ModelEntry) -> dict | None:
        """Where the model's start stands (placement.starts.cold_start); None when it cannot be read now.

        Shared by the requests waiting for the same model for a second: each
        read scans the nodes' weights, and a hundred waiting clients need it once.
        """
        now = time.monotonic()
        cached = self._starts.get(entry.id)
        if cached is not None and now - cached[0] < START_STATUS_TTL_S:
            return cached[1]
        try:
            status = await self.run_db(placement_starts.cold_start, entry.id)
        except (OperationalError, InterfaceError) as exc:
            log.warning("gateway: the start of %s could not be read: %s", entry.name, exc)
            return None
        self._starts[entry.id] = (now, status)
        return status

    def _cold_refusal(self, entry: ModelEntry, status: dict | None, *, up_front: bool) -> errors.Refused:
        """503 with ``Retry-After`` from the start's estimate, saying where the start stands."""
        bound = f"{self.conf.cold_start_timeout_s:g} s (LLMGW_COLD_START_TIMEOUT_S)"
        if status is None:
            return errors.unavailable(
                f"model {entry.name!r} is starting but no replica was ready within {bound}; try again shortly",
                "cold_start_timeout",
            )
        left = status["remaining_s"]
        retry = max(1, math.ceil(left))
        if up_front:
            why = f"{status['sentence']}, longer than this gateway waits, {bound}"
        else:
            why = f"no replica was ready within {bound}: {status['sentence']}"
        return errors.unavailable(
            f"{why}; retry after {retry} s (estimate {status['estimate_s']:g} s: {status['basis']})",
            "cold_start_timeout",
            retry,
        )

    async def _wait_for_replica(
        self, entry: ModelEntry, started: float, cold: coldwait.ColdStream | None = None
    ) -> Snapshot:
        """The snapshot once ``entry`` has a ready replica, or 503 when it will not have one within the bound.

        ``cold`` (streaming requests) is committed after the first keepalive
        interval and gets a comment every interval from then on.
        """
        deadline = started + self.conf.cold_start_timeout_s
        status = await self._start_status(entry)
        if status is not None and status["measured"] and time.monotonic() + status["remaining_s"] > deadline:
            raise self._cold_refusal(entry, status, up_front=True)
        keepalive = time.monotonic() + self.conf.cold_keepalive_s
        while True:
            now = time.monotonic()
            left = deadline - now
            if left <= 0:
                raise self._cold_refusal(entry, await self._start_status(entry), up_front=False)
            if cold is not None and now >= keepalive:
                keepalive = now + self.conf.cold_keepalive_s
                status = await self._start_status(entry)
                if not cold.committed:
                    await cold.commit()
                await cold.comment(f"waiting for {status['sentence'] if status else entry.name + ': starting'}")
            await asyncio.sleep(min(COLD_POLL_S, left, max(0.01, keepalive - time.monotonic())))
            snapshot = await self.directory.refresh(newer_than=time.monotonic() - COLD_POLL_S / 2)
            if snapshot.replicas.get(entry.id):
                return snapshot
            await self._demand(entry)
