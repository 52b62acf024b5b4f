"""Properties over random fleets and catalogs: what the scheduler must never do, whatever it is given.

Every created shard uses free, healthy GPUs of its profile's class on an open
node with the engine and the pool; no GPU is given twice or given while an
existing replica holds it; a MIG replica has exactly one instance; a
multi-node replica sits inside one NVLink domain (every card joined, IMEX up)
or on entirely free nodes of one InfiniBand fabric; no model ends up above its
maximum; and the same snapshot, in any order, gives the same plan.
"""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from catalog.rules import CPU_CLASS, is_mig_class, profile_problems
from placement.scheduler import COUNTING_STATES, ModelInfo, NodeInfo, Plan, Snapshot, plan
from tests.placement.fleet import (
    NOW,
    a100_mig,
    cpu_box,
    hgx_h100,
    model,
    nvl72_rack,
    profile,
    replica,
    snapshot,
)

ALL_ENGINES = ("vllm", "sglang", "llamacpp")
ENGINES = st.sampled_from([None, ALL_ENGINES, ALL_ENGINES, ALL_ENGINES, ("vllm",), (), ("llamacpp",)])
POOLS = st.sampled_from([None, None, None, "gold"])


@st.composite
def h100s(draw, i: int) -> NodeInfo:
    node = hgx_h100(
        f"h100-{i}",
        fabric=draw(st.sampled_from(["ib-east", "ib-east", "ib-west", None])),
        state=draw(st.sampled_from(["ready", "ready", "ready", "cordoned", "draining"])),
        reachable=draw(st.sampled_from([True, True, True, False])),
        engines=draw(ENGINES),
        pool=draw(POOLS),
        unhealthy={g: "Xid 79" for g in draw(st.sets(st.integers(0, 7), max_size=3))},
    )
    return node


@st.composite
def racks(draw, name: str) -> list[NodeInfo]:
    trays = draw(st.integers(3, 8))
    not_joined = {
        t: {draw(st.integers(0, 3)): "In Progress"} for t in draw(st.sets(st.integers(0, trays - 1), max_size=2))
    }
    return nvl72_rack(
        name,
        trays=trays,
        fabric=draw(st.sampled_from(["ib-gb", "ib-east", None])),
        imex=draw(st.sampled_from(["up", "up", "up", "down", None])),
        not_joined=not_joined,
        imex_down=draw(st.sets(st.integers(0, trays - 1), max_size=2)),
        engines=draw(ENGINES),
    )


@st.composite
def mig_boxes(draw, i: int) -> NodeInfo:
    cards = draw(st.sets(st.integers(0, 7), max_size=4))
    carved = {c: draw(st.sampled_from([["3g.40gb", "3g.40gb"], ["3g.40gb"], ["1g.10gb"] * 3])) for c in sorted(cards)}
    empty = draw(st.sets(st.integers(0, 7), max_size=2)) - cards
    return a100_mig(f"mig-{i}", carved=carved, empty_mig=empty, engines=draw(ENGINES))


SHAPES = st.sampled_from(
    [
        dict(gpu_class="h100-80g", gpus=1),
        dict(gpu_class="h100-80g", gpus=2),
        dict(gpu_class="h100-80g", gpus=4),
        dict(gpu_class="h100-80g", gpus=8),
        dict(gpu_class="h100-80g", gpus=8, nodes=2),
        dict(gpu_class="h100-80g", gpus=4, nodes=3),
        dict(gpu_class="gb200-186g", gpus=4),
        dict(gpu_class="gb200-186g", gpus=4, nodes=2),
        dict(gpu_class="gb200-186g", gpus=2, nodes=3),
        dict(gpu_class="a100-80g", gpus=2),
        dict(gpu_class="a100-80g-mig-3g.40gb", gpus=1),
        dict(gpu_class="a100-80g-mig-1g.10gb", gpus=1),
        dict(gpu_class="a100-80g-mig-3g.40gb", gpus=2, tp=2),
        dict(gpu_class=CPU_CLASS, gpus=0, tp=1, memory_gb=100),
    ]
)


MULTI_NODE_SHAPES = st.sampled_from(
    [
        dict(gpu_class="h100-80g", gpus=8, nodes=2),
        dict(gpu_class="h100-80g", gpus=4, nodes=3),
        dict(gpu_class="gb200-186g", gpus=4, nodes=2),
        dict(gpu_class="gb200-186g", gpus=2, nodes=3),
        dict(gpu_class="gb200-186g", gpus=4, nodes=4),
        dict(gpu_class="h100-80g", gpus=2),
    ]
)


@st.composite
def models(draw, i: int, shapes: st.SearchStrategy[dict] = SHAPES) -> ModelInfo:
    profiles = []
    for j in range(draw(st.integers(1, 3))):
        shape = dict(draw(shapes))
        engine = "llamacpp" if shape["gpu_class"] == CPU_CLASS else draw(st.sampled_from(["vllm", "sglang"]))
        profiles.append(profile(f"p{j}", engine=engine, pool=draw(POOLS), **shape))
    low = draw(st.integers(0, 3))
    return model(
        f"model-{i}",
        *profiles,
        min_replicas=low,
        max_replicas=low + draw(st.integers(0, 2)),
        wanted=draw(st.none() | st.integers(0, 6)),
        idle_timeout_s=draw(st.sampled_from([None, 600.0])),
        parked_error=draw(st.sampled_from([None, None, None, "exit 1"])),
    )


@st.composite
def snapshots(draw, shapes: st.SearchStrategy[dict] = SHAPES, at_least: int = 0) -> Snapshot:
    """A random fleet and catalog; ``at_least`` HGX boxes and racks, for the multi-node stories."""
    nodes: list[NodeInfo] = [draw(h100s(i)) for i in range(draw(st.integers(at_least * 3, 6 + at_least * 3)))]
    for r in range(draw(st.integers(at_least, 2))):
        nodes += draw(racks(f"rack-{r}"))
    nodes += [draw(mig_boxes(i)) for i in range(draw(st.integers(0, 2)))]
    nodes += [
        cpu_box(f"cpu-{i}", memory_gb=draw(st.sampled_from([None, 64, 256]))) for i in range(draw(st.integers(0, 2)))
    ]
    catalog = [draw(models(i, shapes)) for i in range(draw(st.integers(1, 6)))]
    # Existing replicas: each node may have its lowest few GPUs held by one replica of some model.
    existing = []
    rng = random.Random(draw(st.integers(0, 2**32)))
    for n, node in enumerate(nodes):
        held = draw(st.sampled_from([0, 0, 0, 0, 0, 1, 2, 4, 8]))
        gpus = [g.index for g in node.gpus if g.parent is None or rng.random() < 0.5][:held]
        if not gpus:
            continue
        owner = rng.choice(catalog)
        existing.append(
            replica(
                f"r{n:03d}",
                owner,
                (node.name, gpus),
                state=rng.choice(["pending", "starting", "ready", "ready", "failed"]),
                last_used_at=rng.choice([None, NOW - timedelta(seconds=rng.randint(0, 4000))]),
            )
        )
    return snapshot(nodes, catalog, existing)


def check(snap: Snapshot, p: Plan) -> None:
    nodes = {n.name: n for n in snap.nodes}
    catalog = {m.name: m for m in snap.models}
    held = {(s.node, g) for r in snap.replicas for s in r.shards for g in s.gpus}
    busy_nodes = {node for node, _ in held}
    given: set[tuple[str, int]] = set()
    for new in [*p.create, *(r.new for r in p.replace)]:
        m = catalog[new.model]
        assert m.parked_error is None
        prof = next(pr for pr in m.profiles if pr.name == new.profile)
        assert not profile_problems(
            engine=prof.engine,
            gpu_class=prof.gpu_class,
            gpus=prof.gpus,
            nodes=prof.nodes,
            tp=prof.tp,
            pp=prof.pp,
            memory_gb=prof.memory_gb,
        )
        assert len(new.shards) == prof.nodes
        assert len(set(new.nodes)) == prof.nodes
        for shard in new.shards:
            node = nodes[shard.node]
            assert node.state == "ready" and node.reachable
            assert node.engines is None or prof.engine in node.engines
            assert not prof.pool or node.labels.get("pool") == prof.pool
            if prof.gpu_class == CPU_CLASS:
                assert shard.gpus == ()
                assert node.memory_mb is not None
                continue
            assert len(shard.gpus) == prof.gpus
            by_index = {g.index: g for g in node.gpus}
            parents = {g.parent for g in node.gpus if g.parent is not None}
            for i in shard.gpus:
                g = by_index[i]
                assert g.healthy and g.gpu_class == prof.gpu_class
                assert not g.mig_mode and i not in parents, "a card in MIG mode is never placed whole"
                assert (shard.node, i) not in held, "a GPU an existing replica holds"
                assert (shard.node, i) not in given, "a GPU given twice"
                given.add((shard.node, i))
            if is_mig_class(prof.gpu_class):
                assert shard.env["CUDA_VISIBLE_DEVICES"] == by_index[shard.gpus[0]].mig_uuid
        if prof.nodes > 1:
            _check_multi_node(nodes, busy_nodes, new)
    _check_counts(snap, p)


def _check_multi_node(nodes: dict[str, NodeInfo], busy_nodes: set[str], new) -> None:
    if new.nvlink_domain:
        for shard in new.shards:
            node = nodes[shard.node]
            cards = [g for g in node.gpus if g.parent is None]
            assert all(g.domain == new.nvlink_domain and g.fabric_state == "Completed" for g in cards)
            assert node.imex_state == "up"
            assert shard.env["NCCL_MNNVL_ENABLE"] == "1"
    else:
        assert new.fabric is not None
        for shard in new.shards:
            assert nodes[shard.node].fabric == new.fabric, "never across two fabrics"
            assert shard.node not in busy_nodes, "over InfiniBand only on entirely free nodes"
            assert "NCCL_MNNVL_ENABLE" not in shard.env


def _check_counts(snap: Snapshot, p: Plan) -> None:
    stopped = {s.replica_id for s in p.stop}
    for m in snap.models:
        live = [r for r in snap.replicas if r.model == m.name and r.state in COUNTING_STATES]
        live_ids = {r.id for r in live}
        olds = {r.replaces for r in live if r.replaces in live_ids}
        after = len(live) - len(olds) - len([r for r in live if r.id in stopped and r.id not in olds])
        after += len([c for c in p.create if c.model == m.name])
        before = len(live) - len(olds)
        assert after <= max(m.max_replicas, m.min_replicas, before), f"{m.name} above its maximum"
        if p.create and any(c.model == m.name for c in p.create):
            assert after <= max(m.max_replicas, m.min_replicas)


@settings(max_examples=100, deadline=None)
@given(snapshots())
def test_no_plan_ever_breaks_a_placement_rule(snap):
    check(snap, plan(snap))


@settings(max_examples=100, deadline=None)
@given(snapshots(MULTI_NODE_SHAPES, at_least=1))
def test_no_multi_node_plan_ever_breaks_a_placement_rule(snap):
    check(snap, plan(snap))


@settings(max_examples=100, deadline=None)
@given(snapshots(), st.randoms(use_true_random=False))
def test_the_same_snapshot_in_any_order_gives_the_same_plan(snap, rnd):
    first = plan(snap)
    assert plan(snap) == first
    shuffled = replace(
        snap,
        nodes=tuple(rnd.sample(snap.nodes, len(snap.nodes))),
        models=tuple(rnd.sample(snap.models, len(snap.models))),
        replicas=tuple(rnd.sample(snap.replicas, len(snap.replicas))),
    )
    assert plan(shuffled) == first


@settings(max_examples=100, deadline=None)
@given(snapshots())
def test_applying_a_plan_and_planning_again_creates_nothing_new(snap):
    """What was placed counts next time: a second plan only places what the first could not."""
    first = plan(snap)
    created = [
        replica(
            f"new{i:03d}",
            next(m for m in snap.models if m.name == c.model),
            *[(s.node, s.gpus) for s in c.shards],
            profile_name=c.profile,
            state="pending",
            created_at=NOW,
        )
        for i, c in enumerate(first.create)
    ]
    stopped = {s.replica_id for s in first.stop}
    kept = [r for r in snap.replicas if r.id not in stopped]
    second = plan(replace(snap, replicas=tuple(kept + created)))
    # Short models may get more (a stopped failure freed its GPUs), and so may
    # one whose idle replicas were stopped while demand still asks for them.
    may_grow = set(first.unplaceable) | {s.model for s in first.stop}
    assert not {c.model for c in second.create} - may_grow, "a satisfied model got more"
    check(replace(snap, replicas=tuple(kept + created)), second)
