"""The strip of tiles counted per node and class gives exactly what the node list shows of each node.

``inventory.reads.tiles.node_tiles`` reads PostgreSQL's row per node and class
(NodeDevices), a domain aggregate, and the GPU rows of only the nodes with a
device out of placement. The reference is the node list (every GPU row
through inventory.devices), each node's view cut to a tile's keys.
"""

from __future__ import annotations

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inventory.models import GPU, Node, NVLinkDomain
from inventory.reads import tiles
from placement.models import Replica, Shard
from placement.reads import node_list, node_usage
from tests.api.fleet import add_model, ingest_fleet, place
from tests.inventory.test_device_counts import LATER, NODE, _store

pytestmark = pytest.mark.django_db


def both():
    """(the tiles as counted here, as the node list reads them); an error as its type, which either may raise."""

    def outcome(read):
        try:
            return read(node_usage())
        except (TypeError, KeyError) as exc:  # a health of 1, true or {...} has no first line: both fail on it
            return type(exc)

    return outcome(tiles.node_tiles), outcome(listed)


TILE = ("id", "state", "reachable", "lost", "gpu_total", "gpu_free", "unhealthy_gpus", "nvlink_domain")


def listed(usage) -> list[dict]:
    """The specification: each node of the node list, only what a tile shows."""
    return [{k: n[k] for k in TILE if k in n} for n in node_list()]


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fleet=st.lists(NODE, min_size=1, max_size=6), later=LATER, domains=st.lists(st.integers(0, 2), max_size=12))
def test_random_fleets_give_the_tiles_the_gpu_rows_gave(fleet, later, domains):
    """Cards, carved cards and instances, health of every shape, odd MIG modes, holders naming junk; random domains."""
    with transaction.atomic():
        _store(fleet, later)
        made = [NVLinkDomain.objects.create(cluster_uuid=f"c{i}", clique_id=i) for i in range(2)]
        cards = list(GPU.objects.order_by("node_id", "index"))
        for i, choice in enumerate(domains):
            if cards:
                GPU.objects.filter(pk=cards[i % len(cards)].pk).update(domain=made[choice] if choice < 2 else None)
        got, want = both()
        assert got == want
        transaction.set_rollback(True)


def test_a_varied_fleet_gives_the_tiles_the_gpu_rows_gave():
    from agent.simulator import fleet as F
    from tests.api.fleet import ingest

    sims = {s.name: s for s in ingest_fleet("gb200-nvl72:1,h100-hgx:3,a100-mig:2,cpu:1")}
    F.gpu_lost(sims["hgx-001"], 2)
    ingest(sims["hgx-001"])
    GPU.objects.filter(node__name="hgx-002", index=5).update(health=["Xid 79", "row remap"])
    model = add_model()
    place(model, "hgx-000", [0, 1, 2])
    place(model, "hgx-002", [True, -1, 70, 1001, 5, 6, 6])  # junk beside GPUs, an unhealthy one held
    place(model, "mig-00", [1000, 1001, 3])
    # A tray with a card off the domain, one with a card in another; a lost, cordoned and unreachable node.
    other = NVLinkDomain.objects.create(cluster_uuid="other", clique_id=9)
    GPU.objects.filter(node__name="nvl72-00-tray-01", index=0).update(domain=None)
    GPU.objects.filter(node__name="nvl72-00-tray-02", index=3).update(domain=other)
    Node.objects.filter(name="hgx-002").update(state="cordoned", reachable=False, lost=True)
    got, want = both()
    assert got == want
    by = {t["id"]: t for t in want}
    assert by["hgx-001"]["unhealthy_gpus"] and by["hgx-002"]["unhealthy_gpus"] == ["gpu 5: Xid 79"]
    assert "nvlink_domain" in by["nvl72-00-tray-00"] and "nvlink_domain" not in by["nvl72-00-tray-01"]
    assert "nvlink_domain" not in by["nvl72-00-tray-02"] and by["cpu-00"]["gpu_total"] == 0
    assert by["hgx-000"]["gpu_free"] == by["hgx-000"]["gpu_total"] - 3
    # 5 is unhealthy and 6 held; true is no GPU 1 (inventory.devices.held_indices, every reader's word).
    assert by["hgx-002"]["gpu_free"] == by["hgx-002"]["gpu_total"] - 2


def queries_of_tiles() -> int:
    usage = node_usage()
    with CaptureQueriesContext(connection) as seen:
        tiles.node_tiles(usage)
    return len(seen)


def test_the_tiles_take_as_many_queries_for_sixty_nodes_as_for_twenty_one():
    ingest_fleet("gb200-nvl72:1,h100-hgx:1,a100-mig:1,cpu:1")
    GPU.objects.filter(node__name="hgx-000", index=1).update(health=["Xid 48"])
    few = queries_of_tiles()
    ingest_fleet("gb200-nvl72:2,h100-hgx:6,a100-mig:2,cpu:1", prefix="more-")
    GPU.objects.filter(node__name__startswith="more-hgx", index=2).update(health=["Xid 79"])
    model = add_model()
    for node in Node.objects.filter(name__startswith="more-hgx"):
        place(model, node.name, [0, 1])
    assert Node.objects.count() == 21 + 36 + 6 + 2 + 1
    assert queries_of_tiles() == few
    assert Replica.objects.count() == Shard.objects.count() == 6
