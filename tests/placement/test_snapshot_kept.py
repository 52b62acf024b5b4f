"""A reader kept from round to round gives the snapshot a new reader gives, and builds only what changed.

``placement.snapshot.FleetReader`` reads again only the rows whose
fingerprint (``core.fingerprints``) differs from what it holds. What could go
wrong: a column the scheduler reads that the fingerprint does not follow (its
change would never be seen), a fingerprint kept from another statement than
the rows (a change made and undone between the two would be kept forever),
a row gone or come back. Each is tried here against a new reader's answer.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.db.models import JSONField, Value
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.simulator import fleet as F
from inventory.models import GPU, CardHold, IBPort, Node, NVLinkDomain
from placement import snapshot
from placement.models import Replica, Shard
from tests.api.fleet import add_model, place
from tests.placement.dbfleet import fleet, register
from tests.placement.test_snapshot_rows import varied_fleet

pytestmark = pytest.mark.django_db

JSON_NULL = Value(None, JSONField())


def same(reader: snapshot.FleetReader, now=None) -> snapshot.Loaded:
    """The kept reader's snapshot, checked against a new reader's; the kept one is returned."""
    now = now or timezone.now()
    kept = reader.load(now)
    fresh = snapshot.load(now)
    assert kept.snapshot == fresh.snapshot
    assert kept.node_ids == fresh.node_ids
    return kept


def more(spec: str) -> None:
    """The nodes of ``spec`` that are not registered yet (the simulator numbers each kind from 0)."""
    known = set(Node.objects.values_list("name", flat=True))
    for sim in F.build_fleet(spec):
        if sim.name not in known:
            register(sim)


def served_fleet():
    varied_fleet()
    model = add_model()
    now = timezone.now()
    first = place(model, "hgx-000", [0, 1], last_used_at=now, ready_at=now)
    wide = place(model, "nvl72-00-tray-00", [0, 1, 2, 3])
    Shard.objects.create(replica=wide, node=Node.objects.get(name="nvl72-00-tray-01"), rank=1, gpu_indices=[0, 1])
    place(model, "hgx-001", [3], state="starting")
    return model, first, wide


# --- every column the scheduler reads is followed ----------------------------------------


NODE_CHANGES = {
    "name": {"name": "renamed"},
    "state": {"state": "draining"},
    "reachable": {"reachable": False},
    "labels": {"labels": {"pool": "blue"}},
    "engines": {"engines": ["sglang"]},
    "memory_mb": {"memory_mb": 12345},
    "imex_state": {"imex_state": "UP"},
    "imex_channels": {"imex_channels": [0, 1]},
}
GPU_CHANGES = {
    "index": {"index": 9},
    "gpu_class": {"gpu_class": "h200-141g"},
    "uuid": {"uuid": "GPU-other"},
    "health": {"health": ["XID 48"]},
    "numa": {"numa": 7},
    "nvlink_peers": {"nvlink_peers": [5]},
    "parent_index": {"parent_index": 3, "index": 1003},
    "mig_uuid": {"mig_uuid": "MIG-x"},
    "mig_mode": {"mig_mode": "enabled"},
    "fabric_state": {"fabric_state": "in progress"},
    "fabric_status": {"fabric_status": "failure"},
    "fabric_degraded": {"fabric_degraded": True},
}


def test_the_fingerprints_follow_exactly_the_columns_read():
    """A column added to the reading and not to its fingerprint would be read once and never again."""
    assert set(NODE_CHANGES) == set(snapshot.NODE_COLUMNS) - {"pk"}
    assert set(GPU_CHANGES) | {"domain_id", "domain__cluster_uuid", "domain__clique_id"} == set(
        snapshot.GPU_COLUMNS
    ) - {"node_id"}


@pytest.mark.parametrize("column", sorted(NODE_CHANGES))
def test_a_change_to_any_node_column_is_read(column):
    fleet("h100-hgx:2")
    reader = snapshot.FleetReader()
    before = same(reader)
    Node.objects.filter(name="hgx-001").update(**NODE_CHANGES[column])
    after = same(reader)
    assert after.snapshot.nodes != before.snapshot.nodes
    assert after.snapshot.nodes[0] is before.snapshot.nodes[0], "the node that did not change is the same object"


@pytest.mark.parametrize("column", sorted(GPU_CHANGES))
def test_a_change_to_any_card_column_is_read(column):
    fleet("h100-hgx:2")
    reader = snapshot.FleetReader()
    before = same(reader)
    GPU.objects.filter(node__name="hgx-001", index=3).update(**GPU_CHANGES[column])
    after = same(reader)
    assert after.snapshot.nodes[1] != before.snapshot.nodes[1]
    assert after.snapshot.nodes[0] is before.snapshot.nodes[0]


def test_a_change_to_a_cards_nvlink_domain_is_read():
    fleet("gb200-nvl72:1")
    reader = snapshot.FleetReader()
    same(reader)
    domain = NVLinkDomain.objects.first()
    NVLinkDomain.objects.filter(pk=domain.pk).update(clique_id=(domain.clique_id or 0) + 1)
    same(reader)
    other = NVLinkDomain.objects.create(cluster_uuid="c0ffee", clique_id=9)
    GPU.objects.filter(node__name="nvl72-00-tray-03", index=0).update(domain=other)
    same(reader)
    GPU.objects.filter(node__name="nvl72-00-tray-03", index=1).update(domain=None)
    same(reader)


REPLICA_CHANGES = {
    "model__name": None,  # a replica never changes model; its model's name may change
    "profile_name": {"profile_name": "other"},
    "state": {"state": "stopping"},
    "created_at": {"created_at": timezone.now() - timedelta(days=1)},
    "profile_fingerprint": {"profile_fingerprint": "f" * 16},
    "last_used_at": {"last_used_at": timezone.now() + timedelta(seconds=1)},
    "replaces_id": "replaces",
    "ready_at": {"ready_at": None},
}


@pytest.mark.parametrize("column", sorted(REPLICA_CHANGES))
def test_a_change_to_any_replica_column_is_read(column):
    assert set(REPLICA_CHANGES) == set(snapshot.REPLICA_COLUMNS) - {"id"}
    model, first, wide = served_fleet()
    reader = snapshot.FleetReader()
    before = same(reader)
    change = REPLICA_CHANGES[column]
    if change is None:
        type(model).objects.filter(pk=model.pk).update(name="renamed")
    elif change == "replaces":
        Replica.objects.filter(pk=wide.pk).update(replaces=first)
    else:
        Replica.objects.filter(pk=first.pk).update(**change)
    after = same(reader)
    assert after.snapshot.replicas != before.snapshot.replicas


def test_shards_are_read_again_when_one_changes_comes_or_goes_or_its_node_is_lost():
    model, first, wide = served_fleet()
    reader = snapshot.FleetReader()
    before = same(reader)
    by_id = {r.id: r for r in before.snapshot.replicas}
    Shard.objects.filter(replica=first).update(gpu_indices=[0, 1, 2])
    after = same(reader)
    unchanged = {r.id: r for r in after.snapshot.replicas if r.id != first.id}
    assert all(by_id[rid] is r for rid, r in unchanged.items()), "only the replica whose shard changed is built"
    Shard.objects.filter(replica=first).update(gpu_indices=[0, 1, "2", True])  # held_indices' reading
    same(reader)
    Shard.objects.filter(replica=wide, rank=1).delete()
    same(reader)
    Shard.objects.create(replica=wide, node=Node.objects.get(name="nvl72-00-tray-05"), rank=2, gpu_indices=[1])
    same(reader)
    Node.objects.filter(name="nvl72-00-tray-05").update(lost=True)
    assert len({r.id: r for r in same(reader).snapshot.replicas}[wide.id].shards) == 1
    Node.objects.filter(name="nvl72-00-tray-05").update(lost=False)
    assert len({r.id: r for r in same(reader).snapshot.replicas}[wide.id].shards) == 2
    Shard.objects.filter(replica=first).delete()
    same(reader)
    Replica.objects.filter(pk=first.pk).delete()
    same(reader)
    place(model, "hgx-003", [5])
    same(reader)


def test_nodes_and_cards_that_come_and_go_and_what_is_read_beside_them():
    fleet("h100-hgx:3,cpu:1")
    reader = snapshot.FleetReader()
    same(reader)
    hgx1 = Node.objects.get(name="hgx-001")
    CardHold.objects.create(node=hgx1, gpu_index=2, since=timezone.now(), reason="ECC")
    same(reader)
    CardHold.objects.filter(node=hgx1).update(reason="XID 79")
    same(reader)
    CardHold.objects.all().delete()
    same(reader)
    IBPort.objects.filter(node=hgx1).update(state="1: DOWN")  # its fabric is no longer known
    same(reader)
    GPU.objects.filter(node=hgx1, index=7).delete()
    same(reader)
    GPU.objects.filter(node=hgx1).delete()  # a node with no card at all
    same(reader)
    GPU.objects.create(node=hgx1, index=0, uuid="GPU-back", name="H100", gpu_class="h100-80g")
    same(reader)
    Node.objects.filter(name="hgx-002").update(lost=True)
    same(reader)
    Node.objects.filter(name="hgx-002").update(lost=False)
    same(reader)
    more("h100-hgx:5")
    same(reader)
    Node.objects.filter(name="cpu-00").delete()
    same(reader)
    Node.objects.all().delete()
    same(reader)
    fleet("cpu:1")
    same(reader)


def test_a_node_that_comes_back_as_it_was_is_read_as_it_is():
    """Nodes deleted and made again with the same rows: the kept rows are equal to them, so keeping them is right."""
    fleet("h100-hgx:1")
    reader = snapshot.FleetReader()
    same(reader)
    Node.objects.update(labels={"x": "1"})
    same(reader)
    Node.objects.update(labels={})
    same(reader)


# --- a fingerprint is kept only with the rows it was read with ---------------------------


def test_a_change_between_the_fingerprints_and_the_rows_is_not_kept_under_the_old_fingerprint(monkeypatch):
    """The row changes (A to B), the reader sees B's fingerprint, and the row changes again (C) before it is read.

    Kept under B's fingerprint, C would stand for the row when it changes back to B, and forever after.
    """
    fleet("h100-hgx:2")
    reader = snapshot.FleetReader()
    same(reader)
    Node.objects.filter(name="hgx-001").update(labels={"v": "B"})
    read_rows = snapshot.FleetReader._read_rows

    def changed_meanwhile(self, nodes):
        Node.objects.filter(name="hgx-001").update(labels={"v": "C"})
        return read_rows(self, nodes)

    monkeypatch.setattr(snapshot.FleetReader, "_read_rows", changed_meanwhile)
    assert same(reader).snapshot.nodes[1].labels == {"v": "C"}
    monkeypatch.setattr(snapshot.FleetReader, "_read_rows", read_rows)
    Node.objects.filter(name="hgx-001").update(labels={"v": "B"})
    assert same(reader).snapshot.nodes[1].labels == {"v": "B"}


def test_the_same_for_cards_and_shards(monkeypatch):
    _, first, _ = served_fleet()
    reader = snapshot.FleetReader()
    same(reader)
    GPU.objects.filter(node__name="hgx-000", index=4).update(numa=5)
    Shard.objects.filter(replica=first).update(gpu_indices=[1])
    read_cards, read_shards = snapshot.FleetReader._read_cards, snapshot.FleetReader._read_shards

    def cards_meanwhile(self, cards, pks):
        GPU.objects.filter(node__name="hgx-000", index=4).update(numa=6)
        return read_cards(self, cards, pks)

    def shards_meanwhile(self, shards, ids):
        Shard.objects.filter(replica=first).update(gpu_indices=[2])
        return read_shards(self, shards, ids)

    monkeypatch.setattr(snapshot.FleetReader, "_read_cards", cards_meanwhile)
    monkeypatch.setattr(snapshot.FleetReader, "_read_shards", shards_meanwhile)
    same(reader)
    monkeypatch.setattr(snapshot.FleetReader, "_read_cards", read_cards)
    monkeypatch.setattr(snapshot.FleetReader, "_read_shards", read_shards)
    GPU.objects.filter(node__name="hgx-000", index=4).update(numa=5)
    Shard.objects.filter(replica=first).update(gpu_indices=[1])
    loaded = same(reader)
    assert {r.id: r for r in loaded.snapshot.replicas}[first.id].shards[0].gpus == (1,)
    assert {n.name: n for n in loaded.snapshot.nodes}["hgx-000"].gpus[4].numa == 5


def test_a_rolled_back_change_read_inside_its_transaction_is_not_kept():
    """The reconciler reads inside its transaction: what it wrote there and then rolled back must not stay."""
    _, first, _ = served_fleet()
    reader = snapshot.FleetReader()
    same(reader)
    with pytest.raises(RuntimeError), transaction.atomic():
        Replica.objects.filter(pk=first.pk).update(state="stopping")
        Node.objects.filter(name="hgx-000").update(state="cordoned")
        reader.load(timezone.now())
        raise RuntimeError
    loaded = same(reader)
    assert {r.id: r for r in loaded.snapshot.replicas}[first.id].state == "ready"


# --- any sequence of changes --------------------------------------------------------------


NODES = ("hgx-000", "hgx-001", "hgx-003", "nvl72-00-tray-00", "nvl72-00-tray-03", "mig-00", "cpu-00")
change = st.one_of(
    st.tuples(st.just("node"), st.sampled_from(NODES), st.sampled_from([*sorted(NODE_CHANGES), "lost"])),
    st.tuples(st.just("card"), st.sampled_from(NODES), st.sampled_from([*sorted(GPU_CHANGES), "delete"])),
    st.tuples(st.just("hold"), st.sampled_from(NODES), st.integers(0, 3)),
    st.tuples(st.just("replica"), st.integers(0, 2), st.sampled_from(["state", "used", "delete", "shard"])),
    st.tuples(st.just("place"), st.sampled_from(NODES), st.integers(0, 7)),
)


def apply(step, model, now) -> None:
    kind, target, what = step
    if kind == "node":
        node = Node.objects.filter(name=target)
        if what == "lost":
            node.update(lost=not node.values_list("lost", flat=True).first())
        elif what != "name":
            node.update(**NODE_CHANGES[what])
    elif kind == "card":
        card = GPU.objects.filter(node__name=target).order_by("index")[:1]
        rows = GPU.objects.filter(pk__in=list(card.values_list("pk", flat=True)))
        if what == "delete":
            rows.delete()
        elif what not in ("index", "parent_index"):  # the card numbering rules are the database's
            rows.update(**GPU_CHANGES[what])
    elif kind == "hold":
        node = Node.objects.get(name=target)
        held = CardHold.objects.filter(node=node, gpu_index=what)
        if held.exists():
            held.delete()
        else:
            CardHold.objects.create(node=node, gpu_index=what, since=now, reason=f"held {what}")
    elif kind == "replica":
        replica = Replica.objects.order_by("id")[target : target + 1].first()
        if replica is None:
            return
        rows = Replica.objects.filter(pk=replica.pk)
        if what == "state":
            rows.update(state="stopping" if replica.state != "stopping" else "ready")
        elif what == "used":
            rows.update(last_used_at=now + timedelta(seconds=target + 1))
        elif what == "delete":
            rows.delete()
        else:
            Shard.objects.filter(replica=replica).update(gpu_indices=[target, 7])
    else:
        place(model, target, [what])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(st.lists(change, min_size=1, max_size=4), min_size=1, max_size=5))
def test_any_rounds_of_changes_give_a_new_readers_snapshot(steps):
    with transaction.atomic():
        model, _, _ = served_fleet()
        now = timezone.now()
        reader = snapshot.FleetReader()
        same(reader, now)
        for round_ in steps:
            for step in round_:
                apply(step, model, now)
            same(reader, now)
        transaction.set_rollback(True)


# --- what a round costs ------------------------------------------------------------------


def round_queries(reader: snapshot.FleetReader) -> int:
    with CaptureQueriesContext(connection) as queries:
        reader.load(timezone.now())
    return len(queries)


def test_a_round_with_nothing_changed_builds_nothing_and_takes_as_many_queries_for_more_nodes():
    served_fleet()
    reader = snapshot.FleetReader()
    first = reader.load(timezone.now()).snapshot
    few = round_queries(reader)
    again = reader.load(timezone.now()).snapshot
    assert all(a is b for a, b in zip(again.nodes, first.nodes, strict=True))
    assert all(a is b for a, b in zip(again.replicas, first.replicas, strict=True))
    more("h100-hgx:12")
    reader.load(timezone.now())
    assert round_queries(reader) == few


def test_a_new_reader_reads_no_fingerprint_twice():
    """load() (the what-if's) reads whole tables with their fingerprints, and asks for no fingerprint alone."""
    served_fleet()
    with CaptureQueriesContext(connection) as queries:
        snapshot.load(timezone.now())
    fresh = len(queries)
    reader = snapshot.FleetReader()
    reader.load(timezone.now())
    Node.objects.filter(name="hgx-000").update(labels={"a": "b"})
    assert round_queries(reader) > fresh, "a kept reader asks for fingerprints, then reads what changed"


def test_unknown_values_are_told_apart_by_the_fingerprints():
    """NULL, JSON null, an empty text and an empty list are four different values of a column."""
    fleet("cpu:1")
    reader = snapshot.FleetReader()
    for imex in (None, [], JSON_NULL, "", [0], "0"):
        Node.objects.update(imex_channels=imex)
        same(reader)
    for engines in (None, [], JSON_NULL, [""], ["a,b"], ["a", "b"]):
        Node.objects.update(engines=engines)
        same(reader)
