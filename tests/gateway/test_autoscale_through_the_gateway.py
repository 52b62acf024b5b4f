"""A load ramp through the real gateway scales a model up and back down to its minimum, every decision explained.

The fleet is simulated: nodes registered through real ingestion, and each
replica the reconciler places is played by a fake engine (marked ready with
that engine's address, as its agent's heartbeat would). Clients stream
through the gateway's ASGI app; its worker publishes its load (the database
here: no Redis), and the reconciler, run every half second on a thread of
its own as the Celery task would, reads it. It runs twice: with Redis, where
every worker's load is shared, and with Redis away, where the database carries it. The windows are short
(LLMGW_AUTOSCALE_UP_WINDOW_S 1 s, LLMGW_AUTOSCALE_COOLDOWN_S 2 s) so the
whole ramp takes seconds.
"""

from __future__ import annotations

import asyncio
import itertools
import os

import pytest
import redis
import redis.asyncio as aioredis
from django.db import connections

from catalog.models import CapacityMeasurement
from gateway.asgi import GatewayApp
from gateway.proxy import Gateway
from placement.models import Autoscale, Replica, ReplicaState, ScaleEvent
from placement.writes.reconciler import reconcile
from tests.gateway.harness import FAST, call, key, settle
from tests.placement.dbfleet import fleet, gpu_profile, model

pytestmark = pytest.mark.django_db(transaction=True)

REDIS_URL = os.environ.get("LLMGW_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")


def _reconcile_and_start(engines: list) -> int:
    """One reconcile; every replica it placed starts at once on the next free fake engine. Returns those ready."""
    try:
        reconcile()
        used = set(Replica.objects.exclude(endpoint="").values_list("endpoint", flat=True))
        free = (e.url for e in engines if e.url not in used)
        for r in Replica.objects.filter(model__name="m", state=ReplicaState.PENDING).order_by("created_at"):
            Replica.objects.filter(pk=r.pk).update(state=ReplicaState.READY, endpoint=next(free))
        return Replica.objects.filter(model__name="m", state=ReplicaState.READY).count()
    finally:
        connections.close_all()


@pytest.mark.parametrize("shared_by", ["redis", "database"])
def test_a_ramp_through_the_gateway_scales_up_and_back_down_to_min(engines, settings, monkeypatch, shared_by):
    settings.LLMGW_REDIS_URL = REDIS_URL if shared_by == "redis" else None
    if shared_by == "redis":
        redis.Redis.from_url(REDIS_URL).flushdb()
    monkeypatch.setenv("LLMGW_AUTOSCALE_UP_WINDOW_S", "1")
    monkeypatch.setenv("LLMGW_AUTOSCALE_COOLDOWN_S", "2")
    fleet("h100-hgx:4")
    model("m", gpu_profile("h100-80g", gpus=8, name="h100"), min_replicas=1, max_replicas=4)
    # Four at once per replica: 80 % of that is 3.2, so 12 clients want 4 replicas.
    CapacityMeasurement.objects.create(model_name="m", profile_name="h100", measurement={"max_concurrency": 4})
    fakes = [engines(tokens=5, token_delay_s=0.1) for _ in range(4)]
    secret = key()
    assert _reconcile_and_start(fakes) == 1

    async def scenario() -> list[tuple[int, int]]:
        shared = aioredis.from_url(REDIS_URL) if shared_by == "redis" else None
        app = GatewayApp(lambda: Gateway(FAST, shared))
        body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
        wanted = {"n": 0}
        statuses: list[int] = []

        async def client(i: int) -> None:
            while i < wanted["n"]:
                answer = await call(app, "/v1/chat/completions", body, key=secret)
                statuses.append(answer.status)

        timeline: list[tuple[int, int]] = []
        clients: list[asyncio.Task] = []
        ramp = [1, 3, 6, 9, 12, 12, 12, 12, 12, 12, 12, 12, 0]
        for step in itertools.chain(ramp, [0] * 40):
            previous, wanted["n"] = wanted["n"], step
            clients += [asyncio.ensure_future(client(i)) for i in range(previous, step)]
            for _ in range(2):
                await asyncio.sleep(0.5)
                ready = await asyncio.to_thread(_reconcile_and_start, fakes)
                timeline.append((step, ready))
            if step == 0 and timeline[-1][1] == 1 and len(timeline) > 2 * len(ramp):
                break
        await asyncio.gather(*clients)
        await settle(app)
        assert set(statuses) == {200}, statuses
        if shared is not None:
            await shared.aclose()
        return timeline

    timeline = asyncio.run(scenario())
    peak = max(ready for _, ready in timeline)
    assert peak == 4, timeline
    assert timeline[-1][1] == 1, timeline
    events = list(ScaleEvent.objects.filter(model__name="m").order_by("at", "id"))
    ups = [e for e in events if e.direction == "up"]
    downs = [e for e in events if e.direction == "down"]
    assert ups and ups[-1].to_replicas == 4
    assert "capacity 4 each at 80 %" in ups[0].reason and "up from 1" in ups[0].reason
    assert [(e.from_replicas, e.to_replicas) for e in downs][-3:] == [(4, 3), (3, 2), (2, 1)]
    assert all("fits on" in e.reason and "at 60 %" in e.reason for e in downs)
    # The load was read from where the gateway put it.
    assert Autoscale.objects.get(model__name="m").load_source == shared_by
