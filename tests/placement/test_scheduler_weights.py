"""Weights where they are: among equally good candidates, the node holding the model's weights, then its fabric.

The properties hold the preference to a tie-break: over random fleets and
catalogs, a plan made knowing where weights are places exactly as many
replicas, of the same models and profiles, as one made without; and a
holder that is as good a candidate as the node chosen without weights is
the one chosen.
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from placement.scheduler import Snapshot, plan
from tests.placement.fleet import (
    cpu_box,
    cpu_profile,
    hgx_h100,
    model,
    nvl72_rack,
    placed_on,
    profile,
    reasons,
    replica,
    snapshot,
    tray,
)
from tests.placement.test_scheduler_properties import check, snapshots

ONE = model("m", profile(gpus=1))


def with_weights(snap: Snapshot, **holders: set[str]) -> Snapshot:
    return replace(snap, weights={m: frozenset(nodes) for m, nodes in holders.items()})


def test_the_node_holding_the_weights_is_chosen_among_equal_ones():
    snap = snapshot([hgx_h100("a"), hgx_h100("b"), hgx_h100("c")], [ONE])
    assert placed_on(plan(snap), "m")[0][0][0] == "a"
    warm = plan(with_weights(snap, m={"c"}))
    assert placed_on(warm, "m") == [[("c", (0,))]]
    assert reasons(warm, "m") == []


def test_then_a_node_on_the_fabric_of_a_holder():
    nodes = [hgx_h100("a", fabric="ib-west"), hgx_h100("b", fabric="ib-east"), hgx_h100("c", state="cordoned")]
    # Every node is in use, so wholeness per fabric is not at stake and the fabric-mate is as good.
    used = [replica(f"r-{n.name}", model("other"), (n.name, [7])) for n in nodes]
    warm = plan(with_weights(snapshot(nodes, [ONE, model("other", min_replicas=0)], used), m={"c"}))
    assert placed_on(warm, "m")[0][0][0] == "b"
    (note,) = reasons(warm, "m")
    assert note.startswith("b: placed on b without the model's weights on disk: the nodes that hold them (c)")
    assert note.endswith("from its fabric")


def test_weights_never_outrank_the_tightest_fit_and_the_explanation_says_so():
    other = model("other", min_replicas=0)
    nodes = [hgx_h100("a"), hgx_h100("b")]
    busy = replica("r1", other, ("a", [0, 1, 2, 3, 4, 5]))
    warm = plan(with_weights(snapshot(nodes, [ONE, other], [busy]), m={"b"}))
    assert placed_on(warm, "m")[0][0][0] == "a"
    assert any("placed on a without the model's weights" in r for r in reasons(warm, "m"))


def test_an_entirely_free_holder_is_not_taken_instead_of_a_node_already_in_use():
    # Breaking up a whole node could cost a later multi-node replica its place.
    other = model("other", min_replicas=0)
    nodes = [hgx_h100("a", unhealthy={7: "Xid 79"}), hgx_h100("b")]
    busy = replica("r1", other, ("b", [7]))
    warm = plan(with_weights(snapshot(nodes, [ONE, other], [busy]), m={"a"}))
    assert placed_on(warm, "m")[0][0][0] == "a"  # a is entirely free but b is not: a was the choice anyway
    warm = plan(with_weights(snapshot(nodes, [ONE, other], [busy]), m={"b"}))
    assert placed_on(warm, "m")[0][0][0] == "a"


def test_a_multi_node_replica_in_a_domain_takes_the_trays_that_hold_the_weights():
    rack = nvl72_rack("rack-a", trays=6)
    m = model("big", profile(gpu_class="gb200-186g", gpus=4, nodes=2))
    cold = plan(snapshot(rack, [m]))
    assert [s.node for s in cold.create[0].shards] == [tray("rack-a", 0), tray("rack-a", 1)]
    warm = plan(with_weights(snapshot(rack, [m]), big={tray("rack-a", 4), tray("rack-a", 5)}))
    assert sorted(s.node for s in warm.create[0].shards) == [tray("rack-a", 4), tray("rack-a", 5)]
    assert reasons(warm, "big") == []


def test_a_multi_node_replica_over_a_fabric_takes_the_free_nodes_that_hold_the_weights():
    nodes = [hgx_h100(f"h{i}") for i in range(4)]
    m = model("big", profile(gpus=8, nodes=2))
    warm = plan(with_weights(snapshot(nodes, [m]), big={"h3"}))
    assert "h3" in [s.node for s in warm.create[0].shards]


def test_weights_on_a_node_the_snapshot_does_not_know_are_ignored():
    warm = plan(with_weights(snapshot([hgx_h100("a")], [ONE]), m={"gone"}))
    assert placed_on(warm, "m")[0][0][0] == "a"
    assert reasons(warm, "m") == []


def _shape(p) -> list[tuple[str, str]]:
    return sorted((r.model, r.profile) for r in [*p.create, *(x.new for x in p.replace)])


@st.composite
def warm_snapshots(draw) -> tuple[Snapshot, Snapshot]:
    snap = draw(snapshots())
    names = sorted(n.name for n in snap.nodes)
    weights = {}
    for m in snap.models:
        if names and draw(st.booleans()):
            weights[m.name] = frozenset(draw(st.sets(st.sampled_from(names), max_size=4)))
    return snap, replace(snap, weights=weights)


@settings(max_examples=300, deadline=None)
@given(warm_snapshots())
def test_knowing_where_weights_are_never_places_fewer_or_other_replicas(pair):
    cold_snap, warm_snap = pair
    cold, warm = plan(cold_snap), plan(warm_snap)
    check(warm_snap, warm)
    assert _shape(warm) == _shape(cold)
    assert warm.unplaceable == cold.unplaceable
    assert warm.stop == cold.stop


@settings(max_examples=200, deadline=None)
@given(st.integers(2, 6), st.data())
def test_among_identical_free_nodes_a_holder_is_always_chosen(count, data):
    nodes = [hgx_h100(f"n{i}") for i in range(count)]
    holder = data.draw(st.sampled_from([n.name for n in nodes]))
    gpus = data.draw(st.sampled_from([1, 2, 4, 8]))
    warm = plan(with_weights(snapshot(nodes, [model("m", profile(gpus=gpus))]), m={holder}))
    assert placed_on(warm, "m")[0][0][0] == holder
    assert reasons(warm, "m") == []


@st.composite
def crowded_fabrics(draw) -> tuple[Snapshot, Snapshot]:
    """HGX boxes on one or two fabrics, some entirely free and some not, with as many GPUs free:
    the fleets where taking the wrong equal-looking node costs a multi-node replica its place."""
    nodes, held = [], []
    filler = model("filler", min_replicas=0)
    for i in range(draw(st.integers(2, 6))):
        broken = draw(st.sets(st.integers(0, 7), max_size=2))
        node = hgx_h100(
            f"n{i}",
            fabric=draw(st.sampled_from(["ib-east", "ib-west"])),
            unhealthy={g: "Xid 79" for g in broken},
            engines=draw(st.sampled_from([("vllm",), ("vllm", "sglang")])),
        )
        nodes.append(node)
        used = sorted(draw(st.sets(st.sampled_from([g for g in range(8) if g not in broken]), max_size=2)))
        if used:
            held.append(replica(f"r{i}", filler, (node.name, used)))
    catalog = [
        filler,
        model("small", profile(gpus=draw(st.sampled_from([1, 2]))), min_replicas=draw(st.integers(1, 3))),
        model("a-wide", profile(gpus=draw(st.sampled_from([4, 6])), nodes=2)),
        model("side", profile(gpus=1, engine="sglang"), min_replicas=draw(st.integers(0, 2))),
    ]
    snap = snapshot(nodes, catalog, held)
    names = [n.name for n in nodes]
    weights = {m: frozenset(draw(st.sets(st.sampled_from(names), max_size=3))) for m in ("small", "a-wide", "side")}
    return snap, replace(snap, weights=weights)


@settings(max_examples=400, deadline=None)
@given(crowded_fabrics())
def test_on_crowded_fabrics_weights_still_never_cost_a_placement(pair):
    cold_snap, warm_snap = pair
    cold, warm = plan(cold_snap), plan(warm_snap)
    check(warm_snap, warm)
    assert _shape(warm) == _shape(cold)
    assert warm.unplaceable == cold.unplaceable


def test_a_cpu_replica_goes_to_the_equally_roomy_node_holding_its_weights():
    llama = model("llama", cpu_profile(memory_gb=48), min_replicas=2)
    nodes = [cpu_box("c0"), cpu_box("c1"), cpu_box("c2", memory_gb=128)]
    assert sorted(s.node for r in plan(snapshot(nodes, [llama])).create for s in r.shards) == ["c0", "c1"]
    warm = plan(with_weights(snapshot(nodes, [llama]), llama={"c1"}))
    first, second = (r.shards[0].node for r in warm.create)
    # c1 holds them and is as roomy as c0: first; then c0, the roomiest left (c1 has 48 GB less now).
    assert (first, second) == ("c1", "c0")
    smaller = plan(with_weights(snapshot(nodes, [llama]), llama={"c2"}))
    assert sorted(r.shards[0].node for r in smaller.create) == ["c0", "c1"], "a smaller node is not as good"
