"""The snapshot's lean reads give exactly what reading whole rows gave, on a fleet that has a bit of everything.

``load`` reads only the columns the scheduler uses, decodes each distinct JSON
value once and asks the ports only what decides a node's fabric. The reference
below is the reading it replaced (every Node and GPU as a model instance, the
whole fabric analysis), kept here word for word so the two can be compared.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

import pytest
from django.db import connection
from django.db.models import JSONField, Value
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from inventory.fabric_inventory import analyze_inventory
from inventory.models import GPU, CardHold, IBPort, Node, NVLinkDomain
from placement import snapshot
from placement.models import Replica, Shard
from placement.scheduler import GpuInfo, NodeInfo, ReplicaInfo, ShardInfo
from tests.api.fleet import add_model, place
from tests.placement.dbfleet import fleet

pytestmark = pytest.mark.django_db

JSON_NULL = Value(None, JSONField())  # the column is NOT NULL; the JSON in it is null
SPEC = "gb200-nvl72:1@north,h100-hgx:3@south,h100-hgx:1@north,a100-mig:2,cpu:2"


# --- the reading that was replaced ------------------------------------------------


def reference_nodes(now) -> tuple[list[NodeInfo], dict[str, int]]:
    rows = list(Node.objects.filter(lost=False).order_by("name"))
    gpus_by_node: dict[int, list[GpuInfo]] = defaultdict(list)
    for g in GPU.objects.filter(node__lost=False).select_related("domain").order_by("node_id", "index"):
        gpus_by_node[g.node_id].append(reference_gpu(g))
    report = analyze_inventory()
    fabrics = {n: k for n in report.node_fabrics if (k := report.fabric_of(n)) is not None}
    holds = dict(((h.node_id, h.gpu_index), h.reason) for h in CardHold.objects.filter(node__lost=False))
    if holds:
        for node_pk, gpus in gpus_by_node.items():
            gpus[:] = [replace(g, held=holds.get((node_pk, g.index))) for g in gpus]
    flapping = snapshot._flapping(now)
    out = []
    for n in rows:
        info = reference_node(n, tuple(gpus_by_node.get(n.pk, ())), fabrics.get(n.name))
        if n.name in flapping:
            info = replace(info, flapping=flapping[n.name])
        out.append(info)
    return out, {n.name: n.pk for n in rows}


def reference_node(n: Node, gpus: tuple[GpuInfo, ...], fabric: str | None) -> NodeInfo:
    channels = n.imex_channels
    return NodeInfo(
        name=n.name,
        state=n.state,
        reachable=n.reachable,
        labels={str(k): str(v) for k, v in (n.labels or {}).items()},
        engines=None if n.engines is None else frozenset(n.engines),
        memory_mb=n.memory_mb,
        imex_state=n.imex_state or None,
        imex_channels=len(channels) if isinstance(channels, list) else None,
        fabric=fabric,
        gpus=gpus,
    )


def reference_gpu(g: GPU) -> GpuInfo:
    peers = g.nvlink_peers
    return GpuInfo(
        index=g.index,
        gpu_class=g.gpu_class,
        uuid=g.uuid,
        healthy=not g.health,
        problems=tuple(str(p) for p in (g.health or [])),
        numa=g.numa,
        nvlink_peers=None if peers is None else frozenset(int(p) for p in peers if isinstance(p, int)),
        parent=g.parent_index,
        mig_uuid=g.mig_uuid,
        mig_mode=g.parent_index is None and g.mig_mode.startswith("enabled"),
        fabric_state=g.fabric_state,
        fabric_status=g.fabric_status,
        domain=g.domain.key if g.domain_id else None,
        degraded=g.fabric_degraded,
    )


# --- a fleet with a bit of everything -------------------------------------------------


def gpus(node: str, *indices: int):
    return GPU.objects.filter(node__name=node, index__in=indices)


def ports(node: str):
    return IBPort.objects.filter(node__name=node)


def varied_fleet() -> None:
    """Held, unhealthy, MIG and NVLink-domain cards; unknown values; lost, unreachable, cordoned nodes; odd ports."""
    fleet(SPEC)
    # Cards: unhealthy, held, unknown NUMA and peers, odd peers, degraded fabric, a domain-less tray card.
    gpus("hgx-000", 1).update(health=["XID 79: fallen off the bus", 3])
    gpus("hgx-000", 2, 5).update(health=["row remap pending"])
    hgx0 = Node.objects.get(name="hgx-000")
    CardHold.objects.create(node=hgx0, gpu_index=2, since=timezone.now(), reason="XID 79 three times")
    CardHold.objects.create(node=hgx0, gpu_index=6, since=timezone.now(), reason="ECC")
    gpus("hgx-001", 0).update(numa=None, nvlink_peers=None)
    gpus("hgx-001", 1).update(nvlink_peers=[2, "x", 3, 2.5, None])
    gpus("hgx-001", 2).update(nvlink_peers=[])
    gpus("nvl72-00-tray-01", 0).update(fabric_degraded=True)
    gpus("nvl72-00-tray-01", 1).update(fabric_degraded=None, domain=None)
    gpus("nvl72-00-tray-02", 0, 1, 2, 3).update(health=JSON_NULL)  # JSON null: no problems known
    # A card in MIG mode with no instance yet, and one not in MIG mode, beside the instances.
    mig = Node.objects.get(name="mig-01")
    for index, mode in ((1, "enabled (pending)"), (2, "disabled")):
        GPU.objects.create(
            node=mig, index=index, uuid=f"GPU-m{index}", name="A100", gpu_class="a100-80g", mig_mode=mode
        )
    # Nodes: unknown engines and memory, odd labels and channels, lost, unreachable, cordoned.
    Node.objects.filter(name="cpu-00").update(engines=None, memory_mb=None, labels=JSON_NULL, imex_channels="3")
    Node.objects.filter(name="hgx-001").update(labels={"pool": "gold", "rack": 7, "x": None}, engines=["vllm"])
    Node.objects.filter(name="hgx-002").update(lost=True)
    Node.objects.filter(name="hgx-003").update(reachable=False, imex_state="", imex_channels=[])
    Node.objects.filter(name="nvl72-00-tray-03").update(state="cordoned", imex_state="down")
    # A lost node's hold is not read; a held card on a node whose cards are gone holds nothing.
    CardHold.objects.create(node=Node.objects.get(name="hgx-002"), gpu_index=0, since=timezone.now(), reason="x")
    # Ports: one down (the rest up), all down, SM unreadable, two fabrics, RoCE, RoCE without a network.
    first = ports("hgx-001").order_by("hca").first()
    IBPort.objects.filter(pk=first.pk).update(state="1: DOWN")
    ports("hgx-003").update(state="1: DOWN")
    tray4 = ports("nvl72-00-tray-04").order_by("hca").first()
    IBPort.objects.filter(pk=tray4.pk).update(sm_guid="", sm_error="umad: timeout")
    south_sm = ports("hgx-000").values_list("sm_guid", flat=True).first()
    tray5 = ports("nvl72-00-tray-05").order_by("hca").first()
    IBPort.objects.filter(pk=tray5.pk).update(sm_guid=south_sm)
    ports("nvl72-00-tray-06").update(link_layer="Ethernet", network="10.0.0.0/24")
    ports("nvl72-00-tray-07").update(link_layer="Ethernet", network="")
    ports("nvl72-00-tray-08").update(state="")  # not reported is not down


def test_load_gives_the_nodes_the_whole_rows_gave():
    varied_fleet()
    now = timezone.now()
    want, want_ids = reference_nodes(now)
    loaded = snapshot.load(now)
    assert loaded.node_ids == want_ids
    assert loaded.domain_ids == {d.key: d.pk for d in NVLinkDomain.objects.all()}
    got = {n.name: n for n in loaded.snapshot.nodes}
    assert [n.name for n in loaded.snapshot.nodes] == [n.name for n in want]
    for n in want:
        assert got[n.name] == n, n.name
    # The fleet did tell the stories it was built for.
    by = {n.name: n for n in want}
    assert {g.index: g.held for g in by["hgx-000"].gpus if g.held} == {2: "XID 79 three times", 6: "ECC"}
    assert not by["hgx-000"].gpus[1].healthy and by["hgx-000"].gpus[1].problems[1] == "3"
    assert by["hgx-001"].gpus[0].nvlink_peers is None and by["hgx-001"].gpus[1].nvlink_peers == {2, 3}
    assert by["hgx-001"].labels == {"pool": "gold", "rack": "7", "x": "None"}
    assert by["cpu-00"].engines is None and by["cpu-00"].labels == {} and by["cpu-00"].imex_channels is None
    assert by["hgx-003"].imex_channels == 0 and by["hgx-003"].imex_state is None
    assert any(g.parent is not None for n in want for g in n.gpus), "MIG instances are in"
    assert any(g.mig_mode for n in want for g in n.gpus)
    assert by["nvl72-00-tray-00"].gpus[0].domain and by["nvl72-00-tray-01"].gpus[1].domain is None
    assert by["hgx-001"].fabric and by["nvl72-00-tray-06"].fabric.startswith("roce:")
    assert by["nvl72-00-tray-08"].fabric
    for unplaced in ("hgx-003", "nvl72-00-tray-04", "nvl72-00-tray-05", "nvl72-00-tray-07", "cpu-00"):
        assert by[unplaced].fabric is None, unplaced


def test_a_report_given_gives_the_same_nodes_as_the_one_read_here():
    """The what-if passes the fabric analysis it made; the reconcile reads only what decides a node's fabric."""
    varied_fleet()
    now = timezone.now()
    assert snapshot.load(now, fabrics=analyze_inventory()).snapshot.nodes == snapshot.load(now).snapshot.nodes


def hold(node: str, index: int) -> None:
    CardHold.objects.create(node=Node.objects.get(name=node), gpu_index=index, since=timezone.now(), reason="x")


def queries_of_load() -> list[str]:
    with CaptureQueriesContext(connection) as queries:
        snapshot.load(timezone.now())
    return [q["sql"] for q in queries]


def test_load_takes_as_many_queries_for_twenty_nodes_as_for_two():
    fleet("h100-hgx:1,cpu:1")
    hold("hgx-000", 0)
    two = queries_of_load()
    fleet("gb200-nvl72:1")
    hold("nvl72-00-tray-00", 1)
    assert Node.objects.count() == 20
    twenty = queries_of_load()
    assert len(twenty) == len(two), "\n".join(twenty)


def reference_replicas(live_nodes: set[str]) -> list[ReplicaInfo]:
    """The replicas as whole rows gave them (model instances, shards prefetched with their nodes)."""
    out = []
    for r in Replica.objects.select_related("model").prefetch_related("shards__node").order_by("id"):
        shards = tuple(
            ShardInfo(node=s.node.name, rank=s.rank, gpus=tuple(int(i) for i in s.gpu_indices))
            for s in sorted(r.shards.all(), key=lambda s: s.rank)
            if s.node.name in live_nodes
        )
        out.append(
            ReplicaInfo(
                id=r.id,
                model=r.model.name,
                profile=r.profile_name,
                state=r.state,
                shards=shards,
                created_at=r.created_at,
                fingerprint=r.profile_fingerprint,
                last_used_at=r.last_used_at,
                replaces=r.replaces_id,
                ready_at=r.ready_at,
            )
        )
    return out


def test_load_gives_the_replicas_the_whole_rows_gave():
    """One shard and several, ranks stored out of order, a shard on a lost node, a replacement, unknown times."""
    varied_fleet()
    model = add_model()
    now = timezone.now()
    one = place(model, "hgx-000", [0, 1], last_used_at=now, ready_at=now)
    place(model, "hgx-001", [3], state="starting")
    wide = place(model, "nvl72-00-tray-00", [0, 1, 2, 3])
    for rank, tray in ((2, "nvl72-00-tray-02"), (1, "nvl72-00-tray-01")):
        Shard.objects.create(replica=wide, node=Node.objects.get(name=tray), rank=rank, gpu_indices=[0, 1, 2, 3])
    on_lost = place(model, "hgx-002", [0])  # hgx-002 is lost: its shard is not held
    Shard.objects.create(replica=on_lost, node=Node.objects.get(name="hgx-003"), rank=1, gpu_indices=[4])
    place(model, "hgx-003", [5], replaces=one, state="pending")
    loaded = snapshot.load(now)
    want = reference_replicas(set(loaded.node_ids))
    assert list(loaded.snapshot.replicas) == want
    by = {r.id: r for r in want}
    assert [s.rank for s in by[wide.id].shards] == [0, 1, 2], "ranks in order"
    assert [s.node for s in by[on_lost.id].shards] == ["hgx-003"], "the lost node's shard left out"
    assert any(r.replaces == one.id for r in want)


def test_load_takes_as_many_queries_for_many_replicas_as_for_one():
    varied_fleet()
    model = add_model()
    place(model, "hgx-000", [0])
    few = len(queries_of_load())
    for i in range(12):
        replica = place(model, "hgx-001", [i % 8])
        Shard.objects.create(replica=replica, node=Node.objects.get(name="hgx-000"), rank=1, gpu_indices=[i % 8])
    assert len(queries_of_load()) == few


@pytest.mark.parametrize("spec", ["h100-hgx:2", "h100-hgx:12,a100-mig:4,cpu:4"])
def test_a_reconcile_with_no_model_reads_no_node(spec):
    """Nothing to place, scale or explain: the snapshot (a second's work at 10,000 nodes) is not read, so the
    pass costs the same few queries whatever the fleet's size; a model added later is placed."""
    from placement.writes import reconciler

    fleet(spec)
    with CaptureQueriesContext(connection) as seen:
        result = reconciler.reconcile()
    assert not result.changed
    touched = [q["sql"] for q in seen.captured_queries if 'FROM "inventory_' in q["sql"]]
    assert not touched, touched
    assert len(seen.captured_queries) <= 12, [q["sql"] for q in seen.captured_queries]
    add_model()
    assert reconciler.reconcile().created, "the first model's replicas are placed"
