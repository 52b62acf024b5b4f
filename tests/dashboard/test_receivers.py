"""The lower apps' signals reach the console's pages: each one, sent as its app sends it, is heard on a socket."""

from __future__ import annotations

import logging
from dataclasses import fields

import pytest
from asgiref.sync import sync_to_async
from django.dispatch import Signal

from dashboard import live, messages, receivers
from inventory import signals as inventory_signals
from inventory.models import Node
from inventory.reachability import SweepResult
from inventory.writes.ingest import IngestResult
from observability import signals as observability_signals
from observability.sweeps import Recorded
from placement import outgoing as placement_outgoing
from placement.writes.reconciler import Result
from tests.dashboard.test_consumers import open_socket, run_async
from tests.livespy import IN_MEMORY

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def in_memory_layer(settings):
    settings.CHANNEL_LAYERS = IN_MEMORY
    live.breaker.reset()


def node_registered(node: Node) -> tuple[Signal, dict]:
    return inventory_signals.node_registered, {"sender": Node, "node": node}


def node_reported(node: Node) -> tuple[Signal, dict]:
    result = IngestResult(node_fields=["load"], gpus_added=[3], ports_changed=["mlx5_0/1"])
    result.domain_moves = [(3, None, "abc/1")]
    return inventory_signals.node_reported, {"sender": Node, "node": node, "result": result}


def nodes_came_back(node: Node) -> tuple[Signal, dict]:
    return inventory_signals.nodes_came_back, {"sender": Node, "nodes": [(node.pk, node.name)]}


def reachability_changed(node: Node) -> tuple[Signal, dict]:
    result = SweepResult(unreachable=[node.name], lost=["gone"], domains_dark=["7"])
    return inventory_signals.reachability_changed, {"sender": Node, "result": result}


def findings_changed(node: Node) -> tuple[Signal, dict]:
    result = Recorded(opened=[("domain_partly_joined", "abc/1")], resolved=[("imex_down", node.name)])
    return observability_signals.findings_changed, {"sender": None, "result": result}


def placement_changed(node: Node) -> tuple[Signal, dict]:
    result = Result(created=["r-1", "r-2"], explained=["m"])
    return placement_outgoing.placement_changed, {"sender": None, "result": result}


def expected(node: Node) -> dict[str, dict]:
    """What the page hears for each signal above: the JSON on the wire that live.js reads."""
    return {
        "node_registered": {"kind": "node.registered", "subject": node.name, "data": {"node": node.pk}},
        "node_reported": {
            "kind": "node.report",
            "subject": node.name,
            "data": {
                "node": node.pk,
                "fields": ["load"],
                "gpus_added": [3],
                "gpus_updated": [],
                "gpus_removed": [],
                "ports": ["mlx5_0/1"],
                "domain_moves": [[3, None, "abc/1"]],
            },
        },
        "nodes_came_back": {"kind": "node.reachable", "subject": node.name, "data": {"node": node.pk}},
        "reachability_changed": {
            "kind": "fleet.reachability",
            "subject": "fleet",
            "data": {"unreachable": [node.name], "lost": ["gone"], "domains_dark": ["7"], "domains_back": []},
        },
        "findings_changed": {
            "kind": "fleet.findings",
            "subject": "fleet",
            "data": {"opened": [["domain_partly_joined", "abc/1"]], "resolved": [["imex_down", node.name]]},
        },
        "placement_changed": {
            "kind": "placement.changed",
            "subject": "fleet",
            "data": {
                "created": 2,
                "replacing": 0,
                "stopped": 0,
                "lost": 0,
                "reaped": 0,
                "parked": 0,
                "timed_out": 0,
                "stale": 0,
                "explained": 1,
                "scaled": 0,
                "waiting": 0,
                "vanished": 0,
            },
        },
    }


SIGNALS = [node_registered, node_reported, nodes_came_back, reachability_changed, findings_changed, placement_changed]


@pytest.mark.parametrize("make", SIGNALS, ids=[s.__name__ for s in SIGNALS])
@run_async
async def test_each_signal_reaches_an_operators_fleet_page(olivia, make):
    node = await sync_to_async(Node.objects.create)(name="hgx-000")
    comm = await open_socket("/ws/console/fleet/", olivia)
    signal, kwargs = make(node)
    await sync_to_async(signal.send, thread_sensitive=False)(**kwargs)
    assert await comm.receive_json_from(timeout=2) == expected(node)[make.__name__]
    assert await comm.receive_nothing(timeout=0.2), "one message per signal"
    await comm.disconnect()


@run_async
async def test_a_node_page_hears_the_signals_about_its_node(olivia):
    node = await sync_to_async(Node.objects.create)(name="hgx-000")
    other = await sync_to_async(Node.objects.create)(name="hgx-001")
    comm = await open_socket(f"/ws/console/nodes/{node.pk}/", olivia)
    for make in (nodes_came_back, node_reported):
        signal, kwargs = make(other)
        await sync_to_async(signal.send, thread_sensitive=False)(**kwargs)
    assert await comm.receive_nothing(timeout=0.3), "another node's messages are not this page's"
    signal, kwargs = nodes_came_back(node)
    await sync_to_async(signal.send, thread_sensitive=False)(**kwargs)
    assert (await comm.receive_json_from(timeout=2))["kind"] == "node.reachable"
    await comm.disconnect()


def test_a_receiver_that_fails_does_not_fail_its_sender(monkeypatch, caplog):
    # The flusher thread sends nodes_came_back: an exception out of send() would end it.
    def broken(pk: int, name: str) -> live.Update:
        raise RuntimeError("cannot build the message")

    monkeypatch.setattr(messages, "node_reachable", broken)
    with caplog.at_level(logging.ERROR, logger="dashboard.receivers"):
        inventory_signals.nodes_came_back.send(sender=Node, nodes=[(1, "hgx-000")])
    assert "on_nodes_came_back failed" in caplog.text


def test_every_signal_is_connected_once_however_often_ready_runs():
    receivers.connect()
    for signal, _ in receivers.CONNECTIONS:
        assert len(signal.receivers) == 1, signal


def test_a_placement_message_names_every_count_the_reconciler_keeps():
    assert set(messages.PlacementChanged.__annotations__) == {f.name for f in fields(Result)}
