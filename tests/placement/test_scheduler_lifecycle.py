"""How many replicas a model gets, and which are stopped, moved, parked or reported stale."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from placement.scheduler import plan
from tests.placement.fleet import (
    NOW,
    hgx_h100,
    model,
    placed_on,
    profile,
    reasons,
    replica,
    snapshot,
)

TWO_BOXES = [hgx_h100("h100-01"), hgx_h100("h100-02")]


def stopped(p) -> dict[str, str]:
    return {s.replica_id: s.reason for s in p.stop}


# --- how many ---


def test_a_model_gets_its_minimum():
    p = plan(snapshot(TWO_BOXES, [model("m", min_replicas=3, max_replicas=5)]))
    assert len(placed_on(p, "m")) == 3


def test_demand_is_clamped_to_the_maximum():
    p = plan(snapshot(TWO_BOXES, [model("m", min_replicas=1, max_replicas=3, wanted=10)]))
    assert len(placed_on(p, "m")) == 3


def test_demand_below_the_minimum_does_not_lower_it():
    p = plan(snapshot(TWO_BOXES, [model("m", min_replicas=2, max_replicas=3, wanted=0)]))
    assert len(placed_on(p, "m")) == 2


def test_an_on_demand_model_is_placed_only_when_asked_for():
    assert plan(snapshot(TWO_BOXES, [model("m", min_replicas=0, max_replicas=2)])).create == ()
    p = plan(snapshot(TWO_BOXES, [model("m", min_replicas=0, max_replicas=2, wanted=1)]))
    assert len(placed_on(p, "m")) == 1


def test_pending_starting_and_ready_replicas_count_failed_ones_do_not():
    m = model("m", min_replicas=4, max_replicas=4)
    existing = [
        replica("r1", m, ("h100-01", [0]), state="pending"),
        replica("r2", m, ("h100-01", [1]), state="starting"),
        replica("r3", m, ("h100-01", [2]), state="ready"),
        replica("r4", m, ("h100-01", [3]), state="failed"),
    ]
    p = plan(snapshot(TWO_BOXES, [m], existing))

    assert stopped(p) == {"r4": "failed; stopped so its GPUs are freed"}
    # The failed replica's GPU stays taken until it has actually stopped.
    assert placed_on(p, "m") == [[("h100-01", (4,))]]


def test_every_minimum_is_met_before_any_extra_demand():
    one_box = [hgx_h100("h100-01")]
    greedy = model("a-greedy", profile(gpus=4), min_replicas=1, max_replicas=2, wanted=2)
    modest = model("b-modest", profile(gpus=4), min_replicas=1)
    p = plan(snapshot(one_box, [greedy, modest]))

    assert len(placed_on(p, "a-greedy")) == 1
    assert len(placed_on(p, "b-modest")) == 1
    assert p.unplaceable == ("a-greedy",)


def test_replicas_above_the_maximum_are_stopped_not_yet_serving_first():
    m = model("m", min_replicas=1, max_replicas=2)
    existing = [
        replica("r1", m, ("h100-01", [0]), last_used_at=NOW),
        replica("r2", m, ("h100-01", [1]), state="starting"),
        replica("r3", m, ("h100-01", [2]), last_used_at=NOW - timedelta(minutes=5)),
    ]
    p = plan(snapshot(TWO_BOXES, [m], existing))
    assert stopped(p) == {"r2": "above the maximum of 2 replicas"}
    assert p.create == ()


# --- idle ---


def test_idle_replicas_are_scaled_down_to_the_minimum_longest_idle_first():
    m = model("m", min_replicas=1, max_replicas=4, idle_timeout_s=1800)
    existing = [
        replica("busy", m, ("h100-01", [0]), last_used_at=NOW - timedelta(minutes=1)),
        replica("never-used", m, ("h100-01", [1]), created_at=NOW - timedelta(hours=3)),
        replica("quiet", m, ("h100-01", [2]), last_used_at=NOW - timedelta(hours=1)),
        replica("quieter", m, ("h100-01", [3]), last_used_at=NOW - timedelta(hours=2)),
    ]
    p = plan(snapshot(TWO_BOXES, [m], existing))

    assert stopped(p) == {
        "never-used": "idle for 10800 s (timeout 1800 s); scaling down to the minimum of 1",
        "quieter": "idle for 7200 s (timeout 1800 s); scaling down to the minimum of 1",
        "quiet": "idle for 3600 s (timeout 1800 s); scaling down to the minimum of 1",
    }
    assert p.create == ()


def test_idle_scale_down_stops_at_the_minimum():
    m = model("m", min_replicas=2, max_replicas=4, idle_timeout_s=600)
    existing = [replica(f"r{i}", m, ("h100-01", [i]), last_used_at=NOW - timedelta(hours=i + 1)) for i in range(3)]
    p = plan(snapshot(TWO_BOXES, [m], existing))
    assert list(stopped(p)) == ["r2"]


def test_a_replica_not_yet_ready_is_not_idle_however_old():
    m = model("m", min_replicas=0, max_replicas=1, wanted=1, idle_timeout_s=600)
    p = plan(snapshot(TWO_BOXES, [m], [replica("r1", m, ("h100-01", [0]), state="starting")]))
    assert p.stop == ()


def test_a_replica_used_recently_is_kept_even_past_its_age():
    m = model("m", min_replicas=0, max_replicas=1, idle_timeout_s=600)
    p = plan(snapshot(TWO_BOXES, [m], [replica("r1", m, ("h100-01", [0]), last_used_at=NOW - timedelta(seconds=599))]))
    assert p.stop == ()


# --- stale ---


def test_a_replica_placed_under_an_older_profile_is_reported_stale_not_stopped():
    m = model("m", min_replicas=2, max_replicas=2)
    existing = [
        replica("old-def", m, ("h100-01", [0]), fingerprint="0123456789abcdef"),
        replica("current", m, ("h100-01", [1])),
        replica("unknown", m, ("h100-01", [2]), fingerprint=""),
    ]
    p = plan(snapshot(TWO_BOXES, [model("m", min_replicas=3, max_replicas=3)], existing))
    assert p.stale == ("old-def",)
    assert p.stop == ()


# --- drain ---


def test_a_draining_node_gets_a_replacement_planned_before_anything_stops():
    m = model("m", profile(gpus=8))
    nodes = [hgx_h100("old", state="draining"), hgx_h100("new")]
    p = plan(snapshot(nodes, [m], [replica("r1", m, ("old", range(8)))]))

    assert p.stop == ()
    assert p.create == ()
    [move] = p.replace
    assert move.old_replica_id == "r1"
    assert move.new.nodes == ("new",)
    assert move.reason == "node old is draining"


def _hold(node, index: int, reason: str):
    gpus = tuple(replace(g, held=reason) if g.index == index else g for g in node.gpus)
    return replace(node, gpus=gpus)


def test_a_replica_on_a_held_card_is_moved_replacement_first_and_nothing_lands_on_the_card():
    m = model("m", profile(gpus=4))
    nodes = [_hold(hgx_h100("sick"), 2, "Xid 79: GPU has fallen off the bus."), hgx_h100("other", cards=0)]
    p = plan(snapshot(nodes, [m], [replica("r1", m, ("sick", range(4)))]))
    assert p.stop == () and p.create == ()
    [move] = p.replace
    assert move.old_replica_id == "r1"
    assert move.new.nodes == ("sick",) and 2 not in move.new.shards[0].gpus, "the node's other cards serve"
    assert move.reason == "a card it uses on node sick is held: Xid 79: GPU has fallen off the bus."


def test_a_held_card_with_nowhere_to_move_keeps_its_replica_running_and_says_so():
    m = model("m", profile(gpus=8))
    nodes = [_hold(hgx_h100("sick"), 0, "Xid 48")]
    p = plan(snapshot(nodes, [m], [replica("r1", m, ("sick", range(8)))]))
    assert p.stop == p.replace == ()
    assert "sick: replica r1 on a held card of sick has nowhere to move, so it keeps running" in reasons(p, "m")


def test_while_the_replacement_starts_the_old_replica_keeps_serving():
    m = model("m", profile(gpus=8))
    nodes = [hgx_h100("old", state="draining"), hgx_h100("new")]
    existing = [
        replica("r1", m, ("old", range(8))),
        replica("r2", m, ("new", range(8)), state="starting", replaces="r1"),
    ]
    p = plan(snapshot(nodes, [m], existing))
    assert p.stop == p.replace == p.create == ()


def test_once_the_replacement_is_ready_the_old_replica_is_stopped():
    m = model("m", profile(gpus=8))
    nodes = [hgx_h100("old", state="draining"), hgx_h100("new")]
    existing = [replica("r1", m, ("old", range(8))), replica("r2", m, ("new", range(8)), replaces="r1")]
    p = plan(snapshot(nodes, [m], existing))
    assert stopped(p) == {"r1": "replaced by r2, which is ready"}
    assert p.create == p.replace == ()


def test_a_failed_replacement_is_planned_again():
    m = model("m", profile(gpus=4))
    nodes = [hgx_h100("old", state="draining"), hgx_h100("new")]
    existing = [
        replica("r1", m, ("old", range(4))),
        replica("r2", m, ("new", range(4)), state="failed", replaces="r1"),
    ]
    p = plan(snapshot(nodes, [m], existing))
    assert stopped(p) == {"r2": "failed; stopped so its GPUs are freed"}
    [move] = p.replace
    assert (move.old_replica_id, move.new.shards[0].gpus) == ("r1", (4, 5, 6, 7))


def test_a_replica_with_nowhere_to_move_keeps_running_and_says_why():
    m = model("m", profile(gpus=8))
    p = plan(snapshot([hgx_h100("old", state="draining")], [m], [replica("r1", m, ("old", range(8)))]))

    assert p.stop == p.replace == ()
    assert reasons(p, "m")[0] == "old: replica r1 on draining node old has nowhere to move, so it keeps running"
    assert "old: draining: takes nothing new, its replicas are being moved" in reasons(p, "m")


def test_a_drained_replica_the_model_does_not_need_is_simply_stopped():
    m = model("m", min_replicas=1, max_replicas=2)
    nodes = [hgx_h100("old", state="draining"), hgx_h100("new")]
    existing = [replica("r1", m, ("old", [0])), replica("r2", m, ("new", [0]))]
    p = plan(snapshot(nodes, [m], existing))
    assert p.replace == ()
    assert stopped(p) == {"r1": "on draining node old, and m has more replicas than it needs"}


# --- parked and removed ---


def test_a_parked_model_places_nothing_and_says_why():
    m = model("m", min_replicas=2, parked_error="CUDA out of memory")
    p = plan(snapshot(TWO_BOXES, [m]))

    assert p.create == ()
    assert p.parked == {"m": "CUDA out of memory"}
    assert reasons(p, "m") == [
        "parked: its replicas failed at every start, last with 'CUDA out of memory'; "
        "nothing is placed for it until an operator unparks it"
    ]
    assert p.unplaceable == ()


def test_replicas_of_a_model_no_longer_in_the_catalog_are_stopped():
    gone = model("gone")
    p = plan(snapshot(TWO_BOXES, [], [replica("r1", gone, ("h100-01", [0]))]))
    assert stopped(p) == {"r1": "model no longer in the catalog"}


def test_moving_a_drained_replica_comes_before_another_models_minimum():
    serving = model("b-serving", profile(gpus=8))
    newcomer = model("a-newcomer", profile(gpus=8))
    nodes = [hgx_h100("old", state="draining"), hgx_h100("spare")]
    p = plan(snapshot(nodes, [newcomer, serving], [replica("r1", serving, ("old", range(8)))]))

    assert [(m.old_replica_id, m.new.nodes) for m in p.replace] == [("r1", ("spare",))]
    assert p.unplaceable == ("a-newcomer",)
