"""A replica's endpoint comes only from the node running its rank 0, and only at that node's own address.

The gateway sends clients' bodies to the endpoint, so a node that could name
it for another node's replica, or point it at any URL, could take a replica's
traffic or make the control host call into its own network.
"""

from __future__ import annotations

import logging

import pytest

from inventory.models import Node
from placement.models import Replica, ReplicaState, Shard
from placement.writes.reconciler import reconcile
from tests.placement.dbfleet import fleet, gpu_profile, heartbeat, live, model, shard_entry

pytestmark = pytest.mark.django_db

OWN = "http://127.0.0.1:8000"  # the simulated nodes report address 127.0.0.1


@pytest.fixture
def wide():
    """A replica over two nodes: (replica, rank 0's node, rank 1's node)."""
    fleet("h100-hgx:3@north")
    model("wide", gpu_profile("h100-80g", gpus=8, nodes=2))
    reconcile()
    (r,) = live("wide")
    first, second = Shard.objects.filter(replica=r).select_related("node").order_by("rank")
    return r, first.node.name, second.node.name


def test_rank_one_cannot_set_rank_zeros_endpoint(wide):
    r, rank0, rank1 = wide
    heartbeat(rank0, [shard_entry(r, "ready", 0, endpoint=OWN)])
    heartbeat(rank1, [shard_entry(r, "ready", 0, endpoint="http://127.0.0.1:6666"), shard_entry(r, "ready", 1)])
    r.refresh_from_db()
    assert r.state == ReplicaState.READY and r.endpoint == OWN


def test_rank_one_naming_an_endpoint_first_is_not_taken(wide):
    r, rank0, rank1 = wide
    heartbeat(rank0, [shard_entry(r, "ready", 0)])
    heartbeat(rank1, [shard_entry(r, "ready", 1), shard_entry(r, "ready", 0, endpoint="http://127.0.0.1:6666")])
    r.refresh_from_db()
    assert r.state == ReplicaState.READY and r.endpoint == ""


def test_a_node_without_a_shard_of_the_replica_changes_nothing(wide):
    r, rank0, rank1 = wide
    outsider = Node.objects.exclude(name__in=[rank0, rank1]).get().name
    before = list(Shard.objects.filter(replica=r).values())
    heartbeat(outsider, [shard_entry(r, "ready", 0, endpoint=OWN), shard_entry(r, "failed", 1, error="x")])
    assert list(Shard.objects.filter(replica=r).values()) == before
    assert Replica.objects.get(id=r.id).endpoint == ""


@pytest.mark.parametrize(
    "endpoint",
    [
        "http://169.254.169.254:80",  # another host: the cloud's metadata service
        "http://gpu-000.sim:8000",  # the node's hostname, but its agent reported another address
        "ftp://127.0.0.1:8000",
        "http://127.0.0.1",  # no port
        "http://127.0.0.1:99999",
        "http://127.0.0.1:0",
        "http://127.0.0.1:8000@evil.example:80",
        "http://evil.example:80#@127.0.0.1:8000",
        "http://127.0.0.1:8000/v1/../../admin",
        "http://127.0.0.1:8000/?x=1",
        "http://127.0.0.1:" + "0" * 300 + "8000",
        "not a url",
        12345,
        ["http://127.0.0.1:8000"],
    ],
)
def test_an_endpoint_not_at_the_nodes_address_is_logged_and_not_stored(wide, endpoint, caplog):
    r, rank0, rank1 = wide
    heartbeat(rank1, [shard_entry(r, "ready", 1)])
    with caplog.at_level(logging.WARNING, logger="placement.writes.shard_status"):
        heartbeat(rank0, [shard_entry(r, "ready", 0, endpoint=endpoint)])
    r.refresh_from_db()
    assert r.state == ReplicaState.READY and r.endpoint == ""
    assert f"node {rank0}: rank 0 of replica {r.id}: endpoint ignored" in caplog.text
    assert "Traceback" not in caplog.text


def test_without_a_reported_address_the_hostname_is_the_nodes_address(wide):
    r, rank0, rank1 = wide
    Node.objects.filter(name=rank0).update(mgmt_addr="", hostname="Tray-7.Example")
    heartbeat(rank1, [shard_entry(r, "ready", 1)])
    heartbeat(rank0, [shard_entry(r, "ready", 0, endpoint="https://tray-7.example:8443/")])
    assert Replica.objects.get(id=r.id).endpoint == "https://tray-7.example:8443/"


def test_an_odd_shard_entry_is_ignored_not_a_failure(wide):
    r, rank0, _ = wide
    odd = [
        {"id": "x-" + "9" * 5000},
        {"id": f"{r.id}-²"},
        {"id": f"{r.id}-0", "state": ["ready"]},
        {"id": f"{r.id}-0", "fetch": {"bytes_done": 2**64, "bytes_total": True}},
    ]
    for entry in odd:
        heartbeat(rank0, [entry])
    shard = Shard.objects.get(replica=r, rank=0)
    assert shard.fetch_done is None and shard.fetch_total is None
