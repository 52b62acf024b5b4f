"""Live pushes: sent through a real Redis; with Redis down, heartbeats are still stored."""

from __future__ import annotations

import json
import time

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

from dashboard import live
from inventory.models import Node
from inventory.writes.heartbeats import Flusher, desk
from llmgw import channel_layers
from llmgw.bootstrap import issue_join_token
from tests.agentapi.agenthttp import HEARTBEAT, asgi
from tests.agentapi.reports import report

pytestmark = pytest.mark.django_db(transaction=True)

REDIS = "redis://127.0.0.1:6379/14"


def redis_layer(url: str) -> dict:
    """The layer as llmgw.settings builds it, with channels_redis's default capacity of 100 a channel."""
    return channel_layers.redis_layer(url, capacity=100, expiry=60)


def listen(group: str) -> str:
    layer = get_channel_layer()
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(group, channel)
    return channel


def receive(channel: str, timeout: float = 3.0) -> dict:
    import asyncio

    async def get():
        return await asyncio.wait_for(get_channel_layer().receive(channel), timeout)

    return async_to_sync(get)()


def post(client, path, body, token):
    return client.post(
        f"/api/v1/agent/{path}",
        data=json.dumps(body),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {token}",
    )


def beat(credential: str, body: dict):
    """A heartbeat through the fast lane, then one round of the flusher (which announces the nodes back)."""
    answer = asgi(HEARTBEAT, credential, body)
    Flusher(desk, interval_s=0).once()
    return answer


@pytest.fixture(autouse=True)
def fresh_breaker():
    live.breaker.reset()
    yield
    live.breaker.reset()


def test_a_report_and_the_newcomer_are_pushed_to_the_fleet(client, settings):
    settings.CHANNEL_LAYERS = redis_layer(REDIS)
    fleet = listen(live.fleet_group())
    answer = post(client, "register", {"name": "tray-01", "machine_id": "m", "report": report()}, issue_join_token())
    assert answer.status_code == 201
    messages = [receive(fleet), receive(fleet)]
    kinds = {m["kind"] for m in messages}
    assert kinds == {"node.report", "node.registered"}
    pushed = next(m for m in messages if m["kind"] == "node.report")
    assert pushed["data"]["gpus_added"] == [0, 1, 2, 3]


def test_with_redis_down_heartbeats_are_stored_and_pushes_resume_later(client, settings):
    settings.CHANNEL_LAYERS = redis_layer("redis://127.0.0.1:1/0")
    credential = post(client, "register", {"name": "tray-01", "machine_id": "m"}, issue_join_token()).json()[
        "credential"
    ]
    Node.objects.update(reachable=False)
    started = time.monotonic()
    answer = beat(credential, {"load": {"cpu_percent": 7.0}})
    assert answer.status_code == 200
    assert Node.objects.get().reachable and Node.objects.get().load == {"cpu_percent": 7.0}
    assert live.breaker.open(), "the failure paused publishing"
    # While paused, heartbeats do not wait on the dead connection at all.
    Node.objects.update(reachable=False)
    quick = time.monotonic()
    assert beat(credential, {}).status_code == 200
    assert time.monotonic() - quick < 0.5
    assert time.monotonic() - started < 15

    # Redis is back: once the pause is over, pushes flow again.
    settings.CHANNEL_LAYERS = redis_layer(REDIS)
    live.breaker.reset()
    fleet = listen(live.fleet_group())
    Node.objects.update(reachable=False)
    assert beat(credential, {}).status_code == 200
    assert receive(fleet)["kind"] == "node.reachable"


def test_a_storm_through_redis_reaches_a_page_whole_however_small_its_channel(settings):
    # channels_redis drops what a channel cannot hold (its capacity, here the default of 100): one message
    # per update filled a page's channel in the first quarter second of a registration storm.
    settings.CHANNEL_LAYERS = redis_layer(REDIS)
    fleet = listen(live.fleet_group())
    for k in range(2700):
        assert live.publish([live.fleet_group()], live.Update(kind="node.registered", subject=f"n-{k:04d}"))
        if k % 900 == 899:
            time.sleep(live.FRAME_EVERY_S + 0.05)  # three windows of 900, each under what one message carries
    live.outbox.flush()
    told, messages = [], 0
    while len(told) < 2700:
        message = receive(fleet)
        messages += 1
        assert message["kind"] != live.RESYNC
        told += (
            [u["subject"] for u in message["data"]["updates"]]
            if message["kind"] == live.BATCH
            else [message["subject"]]
        )
    assert told == [f"n-{k:04d}" for k in range(2700)]
    assert messages <= 8, messages


def test_a_page_that_hears_nothing_for_longer_than_the_layers_blocking_read_stays_open(settings):
    """channels_redis waits on a page's channel with a BRPOP of 5 s; under redis-py 8's default 5 s read
    timeout that wait raised TimeoutError about half the time, and the console closed the page (4503): a
    quiet fleet's pages reconnected every few seconds and missed what was sent while they did."""
    settings.CHANNEL_LAYERS = redis_layer(REDIS)
    fleet = listen(live.fleet_group())
    layer = get_channel_layer()
    assert layer.brpop_timeout < channel_layers.READ_TIMEOUT_S

    async def quiet_then_told() -> dict:
        import asyncio

        async def tell_later() -> None:
            await asyncio.sleep(2 * layer.brpop_timeout + 0.5)
            await layer.group_send(live.fleet_group(), {"type": "live.update", "kind": "node.registered"})

        teller = asyncio.ensure_future(tell_later())
        try:
            return await asyncio.wait_for(layer.receive(fleet), 3 * layer.brpop_timeout)
        finally:
            teller.cancel()

    assert async_to_sync(quiet_then_told)()["kind"] == "node.registered"
