"""The start deadline's rule, pure (placement.scheduling.startdeadline), over every shape of what is known."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from placement.scheduling.startdeadline import Known, NodeFetch, Policy, deadline, fetch_seconds, overdue, rate

sizes = st.one_of(st.none(), st.integers(min_value=1, max_value=10**13))
rates = st.one_of(st.none(), st.floats(min_value=1e3, max_value=1e11))
seconds = st.floats(min_value=0.0, max_value=7 * 86400.0)
policies = st.builds(
    lambda floor, extra, slack: Policy(floor_s=floor, cap_s=floor + extra, slack=slack),
    st.floats(min_value=1.0, max_value=86400.0),
    st.floats(min_value=0.0, max_value=86400.0),
    st.floats(min_value=1.0, max_value=10.0),
)
nodes = st.builds(NodeFetch, st.sampled_from(["a", "b", "c"]), st.booleans(), rates)
knowns = st.builds(
    Known,
    size_bytes=sizes,
    fleet_rate_bps=rates,
    measured_fetch_s=st.one_of(st.none(), seconds),
    default_fetch_s=seconds,
    load_s=seconds,
)


@given(st.lists(nodes, max_size=4), knowns, policies)
def test_the_deadline_stays_between_the_floor_and_the_cap_and_says_why(shards, known, policy):
    d = deadline(shards, known, policy)
    assert policy.floor_s <= d.seconds <= policy.cap_s
    assert f"{policy.slack:g} × (fetch " in d.basis
    fetch = max(fetch_seconds(n, known)[0] for n in shards or [NodeFetch("any node")])
    raw = policy.slack * (fetch + known.load_s)
    assert d.seconds == min(policy.cap_s, max(policy.floor_s, raw))
    assert d.basis.endswith(f"raised to the floor of {policy.floor_s:.0f} s") == (raw < policy.floor_s)
    assert d.basis.endswith(f"cut to the cap of {policy.cap_s:.0f} s") == (raw > policy.cap_s)


@given(st.lists(nodes, min_size=1, max_size=4), knowns, policies)
def test_the_slowest_node_sets_the_deadline(shards, known, policy):
    alone = [deadline([n], known, policy).seconds for n in shards]
    assert deadline(shards, known, policy).seconds == max(alone)


@given(nodes, knowns, policies, st.integers(min_value=1, max_value=10**13))
def test_larger_weights_never_shorten_it(node, known, policy, more):
    smaller = deadline([node], known, policy).seconds
    size = (known.size_bytes or 0) + more
    larger = deadline([node], Known(**{**_fields(known), "size_bytes": size}), policy).seconds
    if known.size_bytes is not None:
        assert larger >= smaller


@given(nodes, knowns, policies, st.floats(min_value=1.0, max_value=100.0))
def test_a_faster_node_never_lengthens_it(node, known, policy, factor):
    faster = NodeFetch(node.node, node.holds_weights, node.rate_bps * factor if node.rate_bps else None)
    assert deadline([faster], known, policy).seconds <= deadline([node], known, policy).seconds


@given(nodes, knowns, policies)
def test_a_node_holding_the_weights_fetches_nothing(node, known, policy):
    holding = NodeFetch(node.node, True, node.rate_bps)
    assert fetch_seconds(holding, known) == (0.0, f"{node.node} holds the weights")
    assert deadline([holding], known, policy).seconds <= deadline([node], known, policy).seconds


def test_the_fetch_follows_the_size_over_the_nodes_rate_then_the_fleets_then_measured_downloads():
    known = Known(size_bytes=100 * 10**9, fleet_rate_bps=50e6, measured_fetch_s=300.0, default_fetch_s=120.0)
    assert fetch_seconds(NodeFetch("a", rate_bps=100e6), known) == (1000.0, "100.0 GB at 100.0 MB/s measured on a")
    s, why = fetch_seconds(NodeFetch("b"), known)
    assert s == 2000.0 and why == "100.0 GB at 50.0 MB/s, the fleet's median (b never measured)"
    unsized = Known(measured_fetch_s=300.0)
    assert fetch_seconds(NodeFetch("a", rate_bps=100e6), unsized)[0] == 300.0
    assert fetch_seconds(NodeFetch("a"), Known(default_fetch_s=120.0)) == (
        120.0,
        "the default 120 s (no size and rate known)",
    )
    d = deadline([NodeFetch("a", rate_bps=100e6)], Known(size_bytes=100 * 10**9, load_s=60.0, load_basis="x"))
    assert d.seconds == 3 * 1060.0
    assert d.basis == "3 × (fetch 1000 s: 100.0 GB at 100.0 MB/s measured on a; load 60 s: x) = 3180 s"
    capped = deadline([NodeFetch("a", rate_bps=1e6)], Known(size_bytes=10**12), Policy(cap_s=7200.0))
    assert capped.seconds == 7200.0 and capped.basis.endswith("cut to the cap of 7200 s")


@given(st.floats(min_value=0.0, max_value=10**6), st.floats(min_value=0.0, max_value=10**6))
def test_overdue_is_strictly_past_the_deadline(waited, limit):
    placed = datetime(2024, 1, 1, tzinfo=UTC)
    now = placed + timedelta(seconds=waited)
    d = deadline([], Known(), Policy(floor_s=limit, cap_s=limit))
    assert overdue(placed, now, d) == ((now - placed).total_seconds() > limit)


def test_the_rate_is_the_median_of_usable_downloads():
    assert rate([]) is None
    assert rate([(0, 5.0), (10, 0.0)]) is None
    assert rate([(100, 1.0), (300, 1.0), (1000, 100.0)]) == 100.0


def _fields(k: Known) -> dict:
    return {f: getattr(k, f) for f in Known.__dataclass_fields__}
