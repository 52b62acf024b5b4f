"""The what-if, pure: a snapshot and the parts lost in, which replicas stop, where they go and who is short out.

Named fleets (an NVL72 rack, HGX boxes on one fabric) for the stories, and
random ones (the scheduler property tests' own) for what must hold whatever
the fleet: losing nothing stops nothing; every replica that stops is placed
elsewhere, or its model has what it wants without it, or its model is named
short; nothing lands on a lost node; a replacement is a replica the scheduler
itself planned, on the fleet without those nodes.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from placement.scheduler import COUNTING_STATES, plan
from placement.scheduling import what_if as W
from tests.placement.fleet import domain_key, hgx_h100, model, nvl72_rack, profile, replica, snapshot, tray
from tests.placement.test_scheduler_properties import MULTI_NODE_SHAPES, snapshots


def _fleet(hgx: int = 3, trays: int = 6, **rack):
    return [hgx_h100(f"hgx-{i}") for i in range(hgx)] + nvl72_rack("rack-a", trays=trays, **rack)


# --- targets ----------------------------------------------------------------------------------


def test_each_kind_of_target_names_its_nodes():
    nodes = _fleet()
    nodes[0] = replace(nodes[0], labels={"rack": "r1"})
    snap = snapshot(nodes, [], [])
    node, domain, fabric, label = W.resolve(["hgx-1", domain_key("rack-a"), "ib-east", "rack=r1"], snap)
    assert (node.kind, node.nodes) == (W.NODE, ("hgx-1",))
    assert (domain.kind, domain.nodes) == (W.NVLINK_DOMAIN, tuple(tray("rack-a", t) for t in range(6)))
    assert (fabric.kind, fabric.nodes) == (W.FABRIC, ("hgx-0", "hgx-1", "hgx-2"))
    assert (label.kind, label.nodes, label.key) == (W.LABEL, ("hgx-0",), "rack=r1")


def test_an_alias_names_a_domain_or_a_fabric():
    snap = snapshot(_fleet(), [], [])
    (rack,) = W.resolve(["the big rack"], snap, {"the big rack": (W.NVLINK_DOMAIN, domain_key("rack-a"))})
    assert rack.kind == W.NVLINK_DOMAIN and len(rack.nodes) == 6


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("hgx-9", "'hgx-9' is not a node, an NVLink domain key, an InfiniBand fabric or LABEL=VALUE"),
        ("rack=nowhere", "no node has the label rack='nowhere'"),
        ("cluster/1", "'cluster/1' is not a node"),
    ],
)
def test_an_unknown_target_is_refused_by_name(text, says):
    with pytest.raises(W.UnknownTarget) as caught:
        W.resolve(["hgx-1", text], snapshot(_fleet(), [], []))
    assert caught.value.target == text and says in caught.value.message


def test_a_named_domain_whose_cards_all_left_is_said_so():
    """A rack whose fabric manager restarted keeps its name, but no card has joined it: nothing to lose."""
    snap = snapshot(_fleet(), [], [])
    with pytest.raises(W.UnknownTarget, match="'rack-b' names an NVLink domain that holds no node now"):
        W.resolve(["rack-b"], snap, {"rack-b": (W.NVLINK_DOMAIN, "other-cluster/1")})


def test_targets_come_as_several_values_or_comma_separated():
    assert W.split_targets(["a,b", " c ", "", "a", "d,,"]) == ["a", "b", "c", "d"]


# --- stories ----------------------------------------------------------------------------------


def test_losing_an_hgx_box_moves_its_replica_to_another():
    m = model("llama", profile(gpus=2))
    snap = snapshot(_fleet(), [m], [replica("r1", m, ("hgx-0", [0, 1]))])
    answer = W.what_if(snap, W.resolve(["hgx-0"], snap), moves_per_minute=10)
    (move,) = answer.moves
    assert move.replica.id == "r1" and move.lost_nodes == ("hgx-0",)
    assert move.new is not None and move.new.nodes[0] != "hgx-0" and move.interconnect == W.ONE_NODE
    assert answer.short == () and answer.placed == 1 and answer.move_minutes == 1


def test_a_multi_node_replica_on_a_lost_rack_falls_back_to_infiniband():
    """Two trays of the rack hold a replica; the rack goes, and two whole HGX boxes on one fabric take it."""
    big = model("big", profile("nvl", gpu_class="gb200-186g", gpus=4, nodes=2), profile("ib", gpus=8, nodes=2))
    shards = ((tray("rack-a", 0), [0, 1, 2, 3]), (tray("rack-a", 1), [0, 1, 2, 3]))
    snap = snapshot(_fleet(), [big], [replica("r1", big, *shards, profile_name="nvl")])
    answer = W.what_if(snap, W.resolve([domain_key("rack-a")], snap), moves_per_minute=10)
    (move,) = answer.moves
    assert move.new is not None and move.new.profile == "ib" and move.new.fabric == "ib-east"
    assert move.interconnect == W.INFINIBAND and set(move.new.nodes) <= {"hgx-0", "hgx-1", "hgx-2"}


def test_a_multi_node_replica_that_loses_one_tray_stays_in_its_domain():
    big = model("big", profile("nvl", gpu_class="gb200-186g", gpus=4, nodes=2))
    shards = ((tray("rack-a", 0), [0, 1, 2, 3]), (tray("rack-a", 1), [0, 1, 2, 3]))
    snap = snapshot(_fleet(), [big], [replica("r1", big, *shards, profile_name="nvl")])
    answer = W.what_if(snap, W.resolve([tray("rack-a", 0)], snap), moves_per_minute=10)
    (move,) = answer.moves
    assert move.interconnect == W.NVLINK and move.new.nvlink_domain == domain_key("rack-a")
    # Tray 1 still holds the old shard's GPUs until it is stopped, as it would for real.
    assert tray("rack-a", 1) not in move.new.nodes and tray("rack-a", 0) not in move.new.nodes


def test_a_model_with_nowhere_to_go_is_short_with_the_schedulers_reasons():
    m = model("llama", profile(gpus=8))
    snap = snapshot([hgx_h100("hgx-0")], [m], [replica("r1", m, ("hgx-0", list(range(8))))])
    answer = W.what_if(snap, W.resolve(["hgx-0"], snap), moves_per_minute=10)
    (move,) = answer.moves
    assert move.new is None and move.needed
    (short,) = answer.short
    assert (short.model, short.wanted, short.after, short.short_today) == ("llama", 1, 0, False)
    assert short.reasons and answer.placed == 0 and answer.move_minutes == 0


def test_a_replica_the_model_can_do_without_is_not_replaced():
    """Two replicas from past demand, a minimum of one: losing one leaves what the model wants."""
    m = model("llama", profile(gpus=1), min_replicas=1, max_replicas=2)
    snap = snapshot(_fleet(), [m], [replica("r1", m, ("hgx-0", [0])), replica("r2", m, ("hgx-1", [0]))])
    answer = W.what_if(snap, W.resolve(["hgx-0"], snap), moves_per_minute=10)
    (move,) = answer.moves
    assert move.new is None and not move.needed and answer.short == ()


def test_a_replica_of_a_model_gone_from_the_catalog_is_not_replaced_and_says_why():
    m = model("llama", profile(gpus=1))
    snap = snapshot(_fleet(), [], [replica("r1", m, ("hgx-0", [0]))])
    (move,) = W.what_if(snap, W.resolve(["hgx-0"], snap), moves_per_minute=10).moves
    assert move.new is None and not move.in_catalog and move.why == "llama is no longer in the catalog"


def test_the_moves_take_as_many_minutes_as_the_rate_needs():
    m = model("small", profile(gpus=1), min_replicas=24, max_replicas=24)
    on_box = [replica(f"r{i:02d}", m, (f"hgx-{i // 8}", [i % 8])) for i in range(24)]
    snap = snapshot(_fleet(hgx=6), [m], on_box)
    answer = W.what_if(snap, W.resolve(["hgx-0", "hgx-1"], snap), moves_per_minute=10)
    assert answer.placed == 16 and answer.move_minutes == 2
    assert W.what_if(snap, W.resolve(["hgx-0", "hgx-1"], snap), moves_per_minute=3).move_minutes == 6
    assert [W.move_minutes(n, 10) for n in (0, 1, 10, 11)] == [0, 1, 1, 2]


# --- properties -------------------------------------------------------------------------------


@st.composite
def losses(draw, shapes=None):
    snap = draw(snapshots() if shapes is None else snapshots(shapes, at_least=1))
    names = sorted(n.name for n in snap.nodes)
    lost = draw(st.sets(st.sampled_from(names), max_size=len(names))) if names else set()
    return snap, tuple(W.Target(text=n, kind=W.NODE, key=n, nodes=(n,)) for n in sorted(lost))


def check(snap, targets, answer) -> None:
    lost = {n for t in targets for n in t.nodes}
    stopping = {r.id for r in snap.replicas if r.state in COUNTING_STATES and any(s.node in lost for s in r.shards)}
    assert {m.replica.id for m in answer.moves} == stopping
    short = {s.model for s in answer.short}
    for move in answer.moves:
        assert (move.why is None) == (move.new is not None)
        if move.new is not None:
            assert not set(move.new.nodes) & lost, "placed on a lost node"
            assert move.new.model == move.replica.model
            assert move.new in answer.plan.create
        elif move.needed:
            assert move.replica.model in short
        elif move.in_catalog:
            # Not replaced and not needed: the scheduler has the model satisfied without it.
            assert move.replica.model not in answer.plan.unplaceable
    for c in answer.plan.create:
        assert not set(c.nodes) & lost
    # The answer is the scheduler's own plan for the fleet without those nodes.
    assert answer.plan == plan(W.without(snap, frozenset(lost)))
    assert answer.move_minutes == W.move_minutes(answer.placed, answer.moves_per_minute)


@settings(max_examples=150, deadline=None)
@given(snapshots())
def test_losing_nothing_stops_nothing_and_plans_as_today(snap):
    answer = W.what_if(snap, (), moves_per_minute=10)
    assert answer.moves == () and answer.placed == 0 and answer.move_minutes == 0
    assert W.without(snap, frozenset()) == snap and answer.plan == plan(snap)
    assert all(s.short_today for s in answer.short)


@settings(max_examples=200, deadline=None)
@given(losses())
def test_every_stopped_replica_is_placed_elsewhere_or_not_needed_or_its_model_is_short(case):
    snap, targets = case
    check(snap, targets, W.what_if(snap, targets, moves_per_minute=10))


@settings(max_examples=100, deadline=None)
@given(losses(MULTI_NODE_SHAPES))
def test_multi_node_replicas_say_how_their_shards_would_talk(case):
    snap, targets = case
    answer = W.what_if(snap, targets, moves_per_minute=7)
    check(snap, targets, answer)
    for move in answer.moves:
        if move.new is not None and len(move.new.shards) > 1:
            assert (move.interconnect == W.NVLINK) == (move.new.nvlink_domain is not None)
            assert (move.interconnect == W.INFINIBAND) == (move.new.fabric is not None)


@settings(max_examples=100, deadline=None)
@given(losses())
def test_losing_every_node_places_nothing(case):
    snap, _ = case
    everything = tuple(W.Target(text=n.name, kind=W.NODE, key=n.name, nodes=(n.name,)) for n in snap.nodes)
    answer = W.what_if(snap, everything, moves_per_minute=10)
    assert answer.placed == 0 and answer.plan.create == ()
    check(snap, everything, answer)
