"""The incremental planner gives exactly the full plan, round after round, whatever changed in between.

``Planner`` keeps the last round's room and per-model assessments and patches
what changed; every answer it gives must equal :func:`plan` on the same
snapshot. The property builds a random fleet and catalog (the scheduler
properties' strategies), lets it settle (the first plan's replicas running,
its stops done), then makes a chain of single changes — a node cordoned,
drained, lost or back, a card unhealthy or held, a replica failed, stopped or
ready, a model's counts changed, the clock moved on — and compares each round.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from hypothesis import event, given, settings
from hypothesis import strategies as st

from placement.scheduler import Plan, Planner, ReplicaInfo, ShardInfo, Snapshot, plan
from tests.placement.fleet import NOW, hgx_h100, model, profile, snapshot
from tests.placement.test_scheduler_properties import snapshots


def settled(snap: Snapshot, p: Plan, round_no: int) -> Snapshot:
    """The next round's snapshot: the plan's stops gone, its new replicas running and just used."""
    stopped = {s.replica_id for s in p.stop}
    kept = [r for r in snap.replicas if r.id not in stopped]
    news = [*p.create, *(r.new for r in p.replace)]
    for i, new in enumerate(news):
        kept.append(
            ReplicaInfo(
                id=f"s{round_no}-{i:03d}",
                model=new.model,
                profile=new.profile,
                fingerprint=new.fingerprint,
                state="ready",
                shards=tuple(ShardInfo(node=s.node, rank=s.rank, gpus=s.gpus) for s in new.shards),
                created_at=snap.now - timedelta(minutes=5),
                last_used_at=snap.now - timedelta(seconds=30),
            )
        )
    return replace(snap, replicas=tuple(kept))


@st.composite
def change(draw, snap: Snapshot) -> tuple[str, Snapshot]:
    """One change to ``snap``, named for the statistics."""
    kinds = ["model counts", "now", "nothing"]
    if snap.nodes:
        kinds += ["node state", "node lost or back", "card"]
    if snap.replicas:
        kinds.append("replica")
    kind = draw(st.sampled_from(kinds))
    if kind in ("node state", "node lost or back", "card"):
        i = draw(st.integers(0, len(snap.nodes) - 1))
        node = snap.nodes[i]
        if kind == "node state":
            node = replace(node, state=draw(st.sampled_from(["ready", "cordoned", "draining"])))
        elif kind == "node lost or back":
            node = replace(node, reachable=not node.reachable)
        elif node.gpus:
            j = draw(st.integers(0, len(node.gpus) - 1))
            g = node.gpus[j]
            g = draw(
                st.sampled_from(
                    [replace(g, healthy=not g.healthy), replace(g, held=None if g.held else "Xid 79: held")]
                )
            )
            node = replace(node, gpus=(*node.gpus[:j], g, *node.gpus[j + 1 :]))
        return kind, replace(snap, nodes=(*snap.nodes[:i], node, *snap.nodes[i + 1 :]))
    if kind == "replica":
        i = draw(st.integers(0, len(snap.replicas) - 1))
        how = draw(st.sampled_from(["failed", "ready", "starting", "stopped"]))
        if how == "stopped":
            return kind, replace(snap, replicas=(*snap.replicas[:i], *snap.replicas[i + 1 :]))
        r = replace(snap.replicas[i], state=how)
        return kind, replace(snap, replicas=(*snap.replicas[:i], r, *snap.replicas[i + 1 :]))
    if kind == "model counts":
        i = draw(st.integers(0, len(snap.models) - 1))
        low = draw(st.integers(0, 3))
        m = replace(
            snap.models[i],
            min_replicas=low,
            max_replicas=low + draw(st.integers(0, 2)),
            wanted=draw(st.none() | st.integers(0, 6)),
        )
        return kind, replace(snap, models=(*snap.models[:i], m, *snap.models[i + 1 :]))
    if kind == "now":
        return kind, replace(snap, now=snap.now + timedelta(seconds=draw(st.integers(0, 4000))))
    return kind, snap


@settings(max_examples=400, deadline=None)
@given(st.data())
def test_every_round_the_incremental_plan_is_the_full_plan(data):
    snap = data.draw(snapshots())
    planner = Planner()
    p = planner.plan(snap)
    assert p == plan(snap)
    snap = settled(snap, p, 0)
    for round_no in range(1, data.draw(st.integers(2, 6))):
        kind, snap = data.draw(change(snap))
        p = planner.plan(snap)
        event(f"{kind}: {'incremental' if planner.incremental else 'full'}")
        assert p == plan(snap), kind
        if data.draw(st.booleans()):
            snap = settled(snap, p, round_no)


def test_a_cordoned_node_is_planned_incrementally_and_as_in_full():
    """A settled fleet: cordoning a node that runs a replica patches the room and re-plans only its model."""
    m = model("llama", profile("h100", gpus=4), min_replicas=3, max_replicas=3)
    nodes = [hgx_h100(f"h100-{i}", fabric="ib-east") for i in range(4)]
    planner = Planner()
    snap = snapshot(nodes, [m])
    first = planner.plan(snap)
    assert not planner.incremental and len(first.create) == 3
    snap = settled(snap, first, 0)
    planner.plan(snap)  # the round after one that placed is planned in full
    busy = first.create[0].shards[0].node
    cordoned = replace(snap, nodes=tuple(replace(n, state="cordoned") if n.name == busy else n for n in nodes))
    p = planner.plan(cordoned)
    assert planner.incremental
    assert p == plan(cordoned)
    later = replace(cordoned, now=NOW + timedelta(seconds=60))
    assert planner.plan(later) == plan(later) and planner.incremental


def test_a_node_whose_empty_mig_card_goes_dark_leaves_the_explanation_of_a_class_nobody_has():
    """Found by the property on a new machine: the explanation of a MIG class no node has carved was kept.

    The room caches each class's explanation; a patched node dropped the cached
    answers of the classes in its indexes, and a MIG class nobody has carved is
    in none, so "gpu 0 is in MIG mode with no instances" stayed after the node
    became unreachable.
    """
    from tests.placement.fleet import a100_mig

    m = model("small", profile("mig", gpu_class="a100-80g-mig-3g.40gb", gpus=1), min_replicas=1, max_replicas=1)
    node = a100_mig("mig-0", empty_mig=[0])
    planner = Planner()
    snap = snapshot([node], [m])
    assert planner.plan(snap) == plan(snap)
    dark = replace(snap, nodes=(replace(node, reachable=False),))
    p = planner.plan(dark)
    assert planner.incremental
    assert p == plan(dark)
    back = replace(dark, nodes=(node,))
    assert planner.plan(back) == plan(back)


def test_more_nodes_changed_than_patching_pays_for_are_planned_afresh_and_as_in_full(monkeypatch):
    """A fleet back from a partition changes every node at once: patched one by one, 10,000 cost 3.2 s of CPU.

    Past ``PATCH_AT_MOST`` the round is planned in full, which is the same plan.
    """
    from placement import scheduler

    monkeypatch.setattr(scheduler, "PATCH_AT_MOST", 2)
    m = model("llama", profile("h100", gpus=4), min_replicas=3, max_replicas=3)
    nodes = [hgx_h100(f"h100-{i}", fabric="ib-east") for i in range(6)]
    planner = Planner()
    snap = snapshot(nodes, [m])
    snap = settled(snap, planner.plan(snap), 0)
    planner.plan(snap)

    def dark(count: int) -> Snapshot:
        return replace(snap, nodes=tuple(replace(n, reachable=i >= count) for i, n in enumerate(nodes)))

    assert planner.plan(dark(2)) == plan(dark(2)) and planner.incremental
    assert planner.plan(dark(5)) == plan(dark(5)) and not planner.incremental
    assert planner.plan(dark(5)) == plan(dark(5)) and planner.incremental
