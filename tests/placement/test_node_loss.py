"""Node loss on a fleet in the database: partitions move nothing, one loss moves after the grace, a rack moves at
the configured rate, a flapper moves once and is cordoned.

The fleet is the simulator's, registered through real ingestion (tests/placement/dbfleet.py); time is driven
by hand: the reachability sweep and the reconciler are called at chosen instants, the nodes that keep beating
get their heartbeat at each, and a node that comes back does so through the heartbeat desk, as in production.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from core.models import AuditEntry, Finding
from inventory import reachability
from inventory.models import FleetEvent, Node
from inventory.reads import partitions
from inventory.writes.heartbeats import desk
from observability import sweeps
from placement import tasks
from placement.models import NodeLossMove, PlacementExplanation, Replica, Shard
from placement.writes.reconciler import reconcile
from tests.placement.dbfleet import fleet, gpu_profile, live, model

pytestmark = pytest.mark.django_db

H100 = gpu_profile("h100-80g", gpus=8)
RULES = reachability.LossRules()  # the defaults: share ½, window 60 s, racks as groups, 3 flaps cordon


class Clock:
    """Seconds since the test began; each step beats the living, sweeps and reconciles at that instant."""

    def __init__(self) -> None:
        self.t0 = timezone.now()
        self.now = self.t0

    def at(self, s: float):
        return self.t0 + timedelta(seconds=s)

    def step(self, s: float, alive: Iterable[str], rules: reachability.LossRules = RULES):
        self.now = self.at(s)
        for name in alive:
            beat(name, self.now)
        result = reachability.sweep(self.now, rules=rules)
        return result, reconcile(self.now)


def beat(name: str, at) -> bool:
    """A heartbeat from ``name`` at ``at``, through the desk and flushed; True when it brought the node back."""
    node = Node.objects.get(name=name)
    desk.remember(node)
    desk.accept(desk.nodes[node.credential_digest], {}, at)
    return any(pk == node.pk for pk, _ in desk.flush().came_back)


def hosts() -> dict[str, str]:
    """Replica id → the node its shard is on, for the replicas that count."""
    return {s.replica_id: s.node.name for s in Shard.objects.filter(replica__in=live("m")).select_related("node")}


def racked(spec: str, racks: dict[str, int]) -> list[str]:
    """The fleet, its nodes labelled ``rack`` in order: {"r1": 4, "r2": 6} labels the first four r1."""
    names = sorted(fleet(spec))
    i = 0
    for rack, count in racks.items():
        for name in names[i : i + count]:
            Node.objects.filter(name=name).update(labels={"rack": rack})
        i += count
    return names


def test_forty_percent_silent_for_ninety_seconds_moves_nothing_and_is_one_partition_finding():
    names = racked("h100-hgx:10", {"r1": 4, "r2": 3, "r3": 3})
    model("m", H100, min_replicas=10, max_replicas=10)
    clock = Clock()
    clock.step(0, names)
    before = hosts()
    assert len(before) == 10
    silent, alive = names[:4], names[4:]

    opened = []
    for s in range(5, 95, 5):
        result, done = clock.step(s, alive)
        opened += result.partitions
        assert not done.lost and not done.created, f"at {s} s a replica moved: {done.summary()}"
    assert opened == ["rack=r1"]
    assert hosts() == before
    assert not Node.objects.filter(lost=True).exists(), "a partition's nodes are not lost"
    (finding,) = Finding.objects.open().filter(kind="partition")
    assert finding.subject == "rack=r1" and finding.severity == "critical"
    assert all(n in finding.message for n in silent) and "4 of 4 nodes" in finding.message
    (event,) = partitions.active()
    assert event["nodes"] == silent and event["since"] <= clock.at(5)
    # The doctor's sweep keeps it open, as the same row, rather than resolving what it did not open.
    sweeps.sweep(clock.now)
    assert list(Finding.objects.open().filter(kind="partition")) == [finding]

    # The rack answers again: the partition is over, its finding resolved, and still nothing moved.
    result, done = clock.step(100, names)
    assert result.partitions_over == ["rack=r1"]
    assert not Finding.objects.open().filter(kind="partition").exists()
    assert hosts() == before and not NodeLossMove.objects.exists()
    sweeps.sweep(clock.now)
    assert not Finding.objects.open().filter(kind="partition").exists(), "and the doctor does not reopen it"


def test_the_same_silence_without_racks_as_groups_is_four_failures_moved_at_the_rate(monkeypatch):
    monkeypatch.setenv("LLMGW_MOVES_PER_MINUTE", "2")
    names = racked("h100-hgx:12", {"r1": 4})
    model("m", H100, min_replicas=6, max_replicas=6)
    clock = Clock()
    no_racks = reachability.LossRules(labels=())
    clock.step(0, names, no_racks)
    on = hosts()
    rack = [n for n in names[:4]]
    victims = sorted(r for r, n in on.items() if n in rack)
    assert victims, "some replicas are on the rack"
    alive = [n for n in names if n not in rack]

    moved_at: dict[str, float] = {}
    for s in range(5, 600, 5):
        result, done = clock.step(s, alive, no_racks)
        assert not result.partitions
        for rid in done.lost:
            moved_at[rid] = s
    assert sorted(moved_at) == victims, "every replica of the rack moved in the end"
    assert min(moved_at.values()) >= 80, "not before the grace (20 s) and the lost delay (60 s)"
    times = sorted(moved_at.values())
    assert all(sum(1 for t in times if a <= t < a + 60) <= 2 for a in times), f"more than 2 a minute: {times}"
    assert len(live("m")) == 6 and not set(hosts().values()) & set(rack)


def test_a_rack_of_hgx_nodes_lost_for_ten_minutes_is_held_then_moved_at_the_rate_oldest_first(monkeypatch):
    """Racks are groups (the default): the rack is a partition for LLMGW_PARTITION_HOLD_S, then losses."""
    monkeypatch.setenv("LLMGW_MOVES_PER_MINUTE", "2")
    names = racked("h100-hgx:12", {"r1": 4, "r2": 4, "r3": 4})
    model("m", H100, min_replicas=6, max_replicas=6)
    clock = Clock()
    clock.step(0, names)
    rack = names[:4]
    victims = sorted(r for r, n in hosts().items() if n in rack)
    assert victims, "some replicas are on the rack"
    alive = names[4:]

    moved_at: dict[str, float] = {}
    opened, expired = [], []
    for s in range(5, 605, 5):
        result, done = clock.step(s, alive)
        opened += result.partitions
        expired += [(g, s) for g in result.partitions_expired]
        for rid in done.lost:
            moved_at[rid] = s
        if s == 100:
            (p,) = partitions.active()
            assert p["until"] == clock.at(300), "held for the bound from the first silence"
            (finding,) = Finding.objects.open().filter(kind="partition")
            assert f"{p['until']:%Y-%m-%d %H:%M:%S}" in finding.message and "lost" in finding.message
    assert opened == ["rack=r1"] and expired == [("rack=r1", 300)]
    assert min(moved_at.values()) == 300, "nothing moved while the partition held"
    assert sorted(moved_at) == victims, "then every replica of the rack moved"
    times = sorted(moved_at.values())
    assert all(sum(1 for t in times if a <= t < a + 60) <= 2 for a in times), f"more than 2 a minute: {times}"
    assert not Finding.objects.open().filter(kind="partition").exists()
    (event,) = FleetEvent.objects.filter(kind=FleetEvent.Kind.PARTITION)
    assert event.detail["ended"] == "held past the bound"
    assert len(live("m")) == 6 and not set(hosts().values()) & set(rack)


def test_one_node_lost_moves_its_replicas_after_the_grace():
    names = sorted(fleet("h100-hgx:4"))
    model("m", H100, min_replicas=2, max_replicas=2)
    clock = Clock()
    clock.step(0, names)
    (victim_replica, victim), *_ = sorted(hosts().items(), key=lambda kv: kv[1])
    alive = [n for n in names if n != victim]
    for s in range(5, 80, 5):
        _, done = clock.step(s, alive)
        assert not done.lost, f"moved at {s} s, before the grace"
    _, done = clock.step(85, alive)
    assert done.lost == [victim_replica]
    assert not Replica.objects.filter(id=victim_replica).exists()
    assert len(live("m")) == 2 and victim not in hosts().values()
    assert not Finding.objects.open().filter(kind="partition").exists()


def test_a_flapping_node_has_its_replicas_moved_once_and_is_cordoned_after_the_threshold():
    names = sorted(fleet("h100-hgx:4"))
    model("m", H100, min_replicas=1, max_replicas=1)
    clock = Clock()
    clock.step(0, names)
    ((first, flapper),) = hosts().items()
    others = [n for n in names if n != flapper]
    s = 0
    for cycle in range(3):
        # Silent long enough to be lost, then back.
        for _ in range(18):
            s += 5
            clock.step(s, others)
        assert Node.objects.get(name=flapper).lost, f"cycle {cycle}: lost"
        s += 5
        assert beat(flapper, clock.at(s)), f"cycle {cycle}: back"
        clock.step(s, names)
    moves = list(NodeLossMove.objects.all())
    assert [(m.replica_id, m.nodes) for m in moves] == [(first, [flapper])], "moved once, in the first loss"
    node = Node.objects.get(name=flapper)
    assert node.state == "cordoned"
    (entry,) = AuditEntry.objects.filter(action="cordon", target=flapper)
    assert entry.actor == "reachability" and "came back 3 times" in entry.detail["reason"]
    assert FleetEvent.objects.filter(kind=FleetEvent.Kind.NODE_FLAPPING, node=node).count() == 1
    # Cordoned once: further sweeps do not cordon it again, and an operator's uncordon starts the count afresh.
    clock.step(s + 5, names)
    assert AuditEntry.objects.filter(action="cordon", target=flapper).count() == 1
    assert len(live("m")) == 1 and flapper not in hosts().values()


def test_a_partition_of_the_whole_fleet_is_one_finding_not_one_per_rack_and_holds_past_the_bound():
    names = racked("h100-hgx:6", {"r1": 3, "r2": 3})
    model("m", H100, min_replicas=3, max_replicas=3)
    clock = Clock()
    clock.step(0, names)
    opened = []
    for s in range(5, 400, 5):
        result, done = clock.step(s, [])
        opened += result.partitions
        assert not done.lost and not result.partitions_expired, f"at {s} s"
    assert opened == ["the fleet"]
    (p,) = partitions.active()
    assert p["until"] is None, "the whole fleet silent: most likely the control host is cut off; it holds"
    assert not Node.objects.filter(lost=True).exists()
    assert Finding.objects.open().filter(kind="partition").count() == 1
    assert not FleetEvent.objects.filter(kind=FleetEvent.Kind.NODE_FLAPPING).exists()


@pytest.mark.django_db(transaction=True)
def test_two_control_hosts_reconciling_at_once_never_move_more_than_the_rate(monkeypatch):
    """Two workers (threads with their own connections) run the reconcile task over and over at the same time."""
    monkeypatch.setenv("LLMGW_MOVES_PER_MINUTE", "2")
    fleet("h100-hgx:8")
    model("m", H100, min_replicas=5, max_replicas=5)
    reconcile()
    on = hosts()
    victims = sorted({n for n in on.values()})[:4]
    now = timezone.now()
    for i, name in enumerate(victims):
        Node.objects.filter(name=name).update(
            reachable=False, lost=True, unreachable_since=now - timedelta(seconds=100 - i)
        )
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            for _ in range(15):
                tasks.reconcile()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    moves = list(NodeLossMove.objects.order_by("lost_at"))
    assert len(moves) == 2, "two in the minute, whichever host made them"
    # The oldest losses first: the first two victims went silent earliest.
    assert [m.nodes for m in moves] == [[victims[0]], [victims[1]]]


def test_a_node_back_from_a_silence_takes_no_new_replica_until_the_window_passes_and_has_a_finding(monkeypatch):
    # No replica here is ever reported ready: the start deadline (30 min at least) would fail them in the flap window.
    monkeypatch.setenv("LLMGW_START_DEADLINE_FLOOR_S", "86400")
    names = sorted(fleet("h100-hgx:2"))
    model("m", H100, min_replicas=1, max_replicas=1)
    clock = Clock()
    clock.step(0, names)
    (host,) = hosts().values()
    (flapper,) = [n for n in names if n != host]
    # Silent 40 s: unreachable, not lost; then back through the heartbeat desk.
    for s in range(5, 45, 5):
        clock.step(s, [host])
    assert not Node.objects.get(name=flapper).reachable
    assert beat(flapper, clock.at(45))
    clock.step(45, names)

    # Only the flapping node has room, and it is kept from new replicas, with the reason.
    model("n", H100, min_replicas=1, max_replicas=1)
    _, done = clock.step(50, names)
    assert not done.created, "nothing new on a node between its first return and the cordon"
    (why,) = PlacementExplanation.objects.filter(model__name="n")
    assert not why.placed
    assert {(r["node"], r["reason"]) for r in why.rejections} == {
        (flapper, "flapping: 1 return in 30 min"),
        (host, "no h100-80g free: 8 in use"),
    }
    sweeps.sweep(clock.now)
    (finding,) = Finding.objects.open().filter(kind="node_flapping")
    assert finding.subject == flapper and "flapping: 1 return in 30 min" in finding.message

    # Past the flap window it is an ordinary node again: the replica lands there and the finding resolves.
    _, done = clock.step(45 + 1805, names)
    assert len(done.created) == 1 and set(hosts().values()) == {host}
    assert [s.node.name for s in Shard.objects.filter(replica__in=live("n")).select_related("node")] == [flapper]
    sweeps.sweep(clock.now)
    assert not Finding.objects.open().filter(kind="node_flapping").exists()
