"""The console's sockets: who may listen, and which pushes each page's socket passes on."""

from __future__ import annotations

import asyncio
import functools

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.auth import AuthMiddlewareStack
from channels.layers import InMemoryChannelLayer
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import AnonymousUser

from dashboard import consumers, live, messages
from dashboard.routing import websocket_urlpatterns
from inventory.models import Node, NVLinkDomain
from tests.api.fleet import ingest_fleet

pytestmark = pytest.mark.django_db(transaction=True)

APP = URLRouter(websocket_urlpatterns)


def run_async(test):
    """Run an async test body in an event loop of its own (pytest-asyncio is not a dependency)."""

    @functools.wraps(test)
    def sync_test(*args, **kwargs):
        return async_to_sync(test)(*args, **kwargs)

    return sync_test


@pytest.fixture(autouse=True)
def in_memory_layer(settings):
    # Room for a storm's messages: at the layer's default of 100 a channel drops what it cannot hold,
    # and a burst of 101 sent before the consumer runs lost its last one.
    settings.CHANNEL_LAYERS = {
        "default": {"BACKEND": "channels.layers.InMemoryChannelLayer", "CONFIG": {"capacity": 1000}}
    }
    live.breaker.reset()


@pytest.fixture
def fleet(db):
    ingest_fleet("gb200-nvl72:1,h100-hgx:2")


async def open_socket(path: str, user, headers=None) -> WebsocketCommunicator:
    comm = WebsocketCommunicator(APP, path, headers=headers or [(b"host", b"console.test")])
    comm.scope["user"] = user
    connected, _ = await comm.connect()
    assert connected
    return comm


async def refused_with(comm: WebsocketCommunicator) -> int | None:
    out = await comm.receive_output(timeout=2)
    assert out["type"] == "websocket.close"
    return out.get("code")


async def publish(update: live.Update) -> None:
    # live.publish is the synchronous helper ingestion calls; run it as ingestion would, off the loop.
    sent = await sync_to_async(live.publish, thread_sensitive=False)([live.fleet_group()], update)
    assert sent


def report(node: str, **data) -> live.Update:
    return live.Update(kind="node.report", subject=node, data={"node": 0, **data})


@run_async
async def test_an_operator_hears_what_is_published_to_the_fleet(olivia):
    comm = await open_socket("/ws/console/fleet/", olivia)
    await publish(report("hgx-000", fields=["load"]))
    assert await comm.receive_json_from(timeout=2) == {
        "kind": "node.report",
        "subject": "hgx-000",
        "data": {"node": 0, "fields": ["load"]},
    }
    await comm.disconnect()


@pytest.mark.parametrize("path", ["/ws/console/fleet/", "/ws/console/nodes/1/", "/ws/console/nvlink/1/"])
@run_async
async def test_nobody_is_refused_with_4403(path):
    comm = await open_socket(path, AnonymousUser())
    assert await refused_with(comm) == 4403


@run_async
async def test_a_colleague_who_is_not_staff_is_refused(db):
    from django.contrib.auth import get_user_model

    carl = await sync_to_async(get_user_model().objects.create_user)("carl")
    comm = await open_socket("/ws/console/fleet/", carl)
    assert await refused_with(comm) == 4403


@run_async
async def test_a_page_of_another_site_is_refused_even_with_the_operators_cookie(olivia):
    headers = [(b"host", b"console.test"), (b"origin", b"https://evil.example")]
    comm = await open_socket("/ws/console/fleet/", olivia, headers)
    assert await refused_with(comm) == 4403
    same = await open_socket(
        "/ws/console/fleet/", olivia, [(b"host", b"console.test"), (b"origin", b"http://console.test")]
    )
    await publish(report("x"))
    assert (await same.receive_json_from(timeout=2))["subject"] == "x"
    await same.disconnect()


@run_async
async def test_a_refused_socket_hears_nothing(olivia):
    comm = await open_socket("/ws/console/fleet/", AnonymousUser())
    assert await refused_with(comm) == 4403
    await publish(report("hgx-000"))
    assert await comm.receive_nothing(timeout=0.3)


@run_async
async def test_a_node_page_hears_its_node_and_the_sweep_that_names_it(olivia, fleet):
    pk = await sync_to_async(lambda: Node.objects.get(name="hgx-000").pk)()
    comm = await open_socket(f"/ws/console/nodes/{pk}/", olivia)
    await publish(report("hgx-001"))
    assert await comm.receive_nothing(timeout=0.3), "another node's report is not this page's"
    await publish(live.Update(kind="fleet.reachability", subject="fleet", data={"unreachable": ["hgx-000"]}))
    assert (await comm.receive_json_from(timeout=2))["kind"] == "fleet.reachability"
    await publish(report("hgx-000"))
    assert (await comm.receive_json_from(timeout=2))["subject"] == "hgx-000"
    await comm.disconnect()


@run_async
async def test_a_node_page_opens_a_publishers_batch_and_keeps_its_own_node(olivia, fleet, monkeypatch):
    # A window's updates reach every page as one batch (dashboard.live); each page's socket filters it.
    monkeypatch.setattr(live, "FRAME_EVERY_S", 5.0)
    pk = await sync_to_async(lambda: Node.objects.get(name="hgx-000").pk)()
    comm = await open_socket(f"/ws/console/nodes/{pk}/", olivia)
    await publish(report("hgx-001"))
    assert await comm.receive_nothing(timeout=0.3)
    for name in ("hgx-001", "hgx-000", "hgx-001", "hgx-000"):
        await publish(report(name, fields=[name]))
    await sync_to_async(live.outbox.flush, thread_sensitive=False)()
    frame = await comm.receive_json_from(timeout=2)
    assert frame["kind"] == messages.BATCH and [u["subject"] for u in frame["data"]["updates"]] == ["hgx-000"] * 2
    await comm.disconnect()


@run_async
async def test_a_publishers_resync_reaches_every_page(olivia, fleet):
    pk = await sync_to_async(lambda: Node.objects.get(name="hgx-000").pk)()
    comm = await open_socket(f"/ws/console/nodes/{pk}/", olivia)
    assert await comm.receive_nothing(timeout=0.3)  # the socket joins its group after it is accepted
    await publish(messages.resync(5000))
    assert await comm.receive_json_from(timeout=2) == messages.resync(5000)
    await comm.disconnect()


@run_async
async def test_a_rack_page_hears_its_trays_and_cards_moving_in_or_out(olivia, fleet):
    domain = await sync_to_async(NVLinkDomain.objects.get)()
    comm = await open_socket(f"/ws/console/nvlink/{domain.pk}/", olivia)
    await publish(report("hgx-000"))
    assert await comm.receive_nothing(timeout=0.3), "an HGX is in no rack"
    await publish(report("nvl72-00-tray-11", fields=["imex_state"]))
    assert (await comm.receive_json_from(timeout=2))["subject"] == "nvl72-00-tray-11"
    await publish(report("newcomer", domain_moves=[[0, None, domain.key]]))
    assert (await comm.receive_json_from(timeout=2))["subject"] == "newcomer"
    await publish(live.Update(kind="fleet.reachability", subject="fleet", data={"domains_dark": [str(domain.pk)]}))
    assert (await comm.receive_json_from(timeout=2))["kind"] == "fleet.reachability"
    await comm.disconnect()


@run_async
async def test_a_socket_for_something_that_does_not_exist_closes_with_4404(olivia, fleet):
    assert await refused_with(await open_socket("/ws/console/nodes/999999/", olivia)) == 4404
    assert await refused_with(await open_socket("/ws/console/nvlink/999999/", olivia)) == 4404


@run_async
async def test_the_session_cookie_is_what_identifies_the_operator(olivia):
    """Through AuthMiddlewareStack as llmgw.asgi wires it: a logged-in session's cookie gets in."""
    from django.test import Client

    client = Client()
    await sync_to_async(client.force_login)(olivia)
    cookie = f"sessionid={client.cookies['sessionid'].value}".encode()
    comm = WebsocketCommunicator(
        AuthMiddlewareStack(APP), "/ws/console/fleet/", headers=[(b"host", b"h"), (b"cookie", cookie)]
    )
    assert (await comm.connect())[0]
    await publish(report("y"))
    assert (await comm.receive_json_from(timeout=2))["subject"] == "y"
    await comm.disconnect()
    stranger = WebsocketCommunicator(AuthMiddlewareStack(APP), "/ws/console/fleet/", headers=[(b"host", b"h")])
    assert (await stranger.connect())[0]
    assert await refused_with(stranger) == 4403


class _LayerAway(InMemoryChannelLayer):
    """A channel layer whose Redis has stopped: joining a group fails as channels_redis's does."""

    async def group_add(self, group, channel):
        raise ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")


@run_async
async def test_a_page_whose_layer_is_away_is_closed_to_reconnect_later(olivia, settings):
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "tests.dashboard.test_consumers._LayerAway"}}
    comm = await open_socket("/ws/console/fleet/", olivia)
    # 4503, not a crash: the page's script reconnects after any code but 4403 and 4404.
    assert await refused_with(comm) == consumers.TRY_AGAIN
    await comm.wait()


async def storm(count: int, every_s: float = 0.0) -> float:
    """``count`` node reports to the fleet group, as fast as the layer takes them or ``every_s`` apart; when done."""
    from channels.layers import get_channel_layer

    layer = get_channel_layer()
    for k in range(count):
        await layer.group_send(live.fleet_group(), {"type": live.MESSAGE_TYPE, **report(f"n-{k:04d}", fields=[k])})
        if every_s:
            await asyncio.sleep(every_s)
    return asyncio.get_running_loop().time()


async def frames_carrying(comm: WebsocketCommunicator, count: int) -> list[tuple[float, dict]]:
    """Frames until they have told of ``count`` messages (a resync tells of all it held), each timed on arrival.

    A receive that times out cancels the consumer (asgiref's communicator), so
    the test waits for what it expects and then asks that nothing more came.
    """
    out: list[tuple[float, dict]] = []
    loop = asyncio.get_running_loop()
    while sum(told(frame) for _, frame in out) < count:
        out.append((loop.time(), await comm.receive_json_from(timeout=5)))
    assert await comm.receive_nothing(timeout=consumers.FRAME_EVERY_S * 2)
    return out


def told(frame: dict) -> int:
    if frame["kind"] == messages.BATCH:
        return len(frame["data"]["updates"])
    return frame["data"]["held"] if frame["kind"] == messages.RESYNC else 1


def carried(frames: list[tuple[float, dict]]) -> list[str]:
    """The subjects the frames told the page about, in order (a batch's each; a lone message's own)."""
    out = []
    for _, frame in frames:
        if frame["kind"] == messages.BATCH:
            out += [u["subject"] for u in frame["data"]["updates"]]
        else:
            out.append(frame["subject"])
    return out


@run_async
async def test_a_burst_is_one_frame_after_the_first_and_loses_nothing(olivia, monkeypatch):
    # A window longer than the burst takes to send on a loaded machine, so the burst is certain to fit in it.
    monkeypatch.setattr(consumers, "FRAME_EVERY_S", 2.0)
    comm = await open_socket("/ws/console/fleet/", olivia)
    await storm(40)
    frames = await frames_carrying(comm, 40)
    # The first goes out at once (nothing came before it); the other 39 wait for the window and go together.
    assert [f["kind"] for _, f in frames] == ["node.report", messages.BATCH]
    assert carried(frames) == [f"n-{k:04d}" for k in range(40)]
    assert frames[1][1]["data"]["updates"][0] == report("n-0001", fields=[1])
    await comm.disconnect()


@run_async
async def test_a_long_storm_is_at_most_a_few_frames_a_second_and_nothing_waits_past_the_window(olivia):
    comm = await open_socket("/ws/console/fleet/", olivia)
    loop = asyncio.get_running_loop()
    started = loop.time()
    sender = asyncio.ensure_future(storm(300, every_s=0.005))
    frames = await frames_carrying(comm, 300)
    last_sent = await sender
    assert carried(frames) == [f"n-{k:04d}" for k in range(300)], "every message, once, in order"
    # One frame a window at most (plus the first, sent at once), however many messages came.
    spent = frames[-1][0] - started
    assert len(frames) <= spent / consumers.FRAME_EVERY_S + 2, (len(frames), spent)
    # The last message waited for its window and no longer (the slack is this loaded test's own).
    assert frames[-1][0] - last_sent < consumers.FRAME_EVERY_S + 0.75
    await comm.disconnect()


@run_async
async def test_more_than_a_batch_holds_is_one_resync(olivia, monkeypatch):
    monkeypatch.setattr(consumers, "FRAME_EVERY_S", 2.0)
    comm = await open_socket("/ws/console/fleet/", olivia)
    await storm(1)
    await storm(consumers.MOST_IN_A_BATCH + 1)
    frames = await frames_carrying(comm, consumers.MOST_IN_A_BATCH + 2)
    assert [f for _, f in frames][1:] == [
        {"kind": messages.RESYNC, "subject": "fleet", "data": {"held": consumers.MOST_IN_A_BATCH + 1}}
    ]
    await comm.disconnect()


@run_async
async def test_a_page_that_leaves_while_messages_are_held_leaves_cleanly(olivia):
    comm = await open_socket("/ws/console/fleet/", olivia)
    await storm(5)
    assert (await comm.receive_json_from(timeout=2))["subject"] == "n-0000"
    await comm.disconnect()
    await asyncio.sleep(consumers.FRAME_EVERY_S * 2)
    assert await comm.receive_nothing(timeout=0.1)
