"""The autoscaler's decision (placement.scheduling.autoscale), exhaustively.

Properties over any load, capacity, history and bounds: never outside
[min, max]; monotone in load; down at most one replica at a time; no
flapping under an oscillating load (a change in one direction is never
followed by one in the other sooner than its window or cooldown); and the
reasons say the numbers.
"""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from placement.scheduling.autoscale import (
    DOWN,
    HOLD,
    UP,
    Capacity,
    History,
    Load,
    Policy,
    capacity_from,
    decide,
)

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
POLICY = Policy()

loads = st.builds(
    Load,
    in_flight=st.integers(0, 2000),
    waiting=st.integers(0, 200),
    tokens_per_s=st.sampled_from([0.0, 0.0, 50.0, 900.0, 20000.0]),
)
capacities = st.builds(
    Capacity,
    profile=st.just("p"),
    concurrency=st.integers(1, 128),
    tokens_per_s=st.sampled_from([None, None, 500.0, 4000.0]),
    measured=st.booleans(),
)
ago = st.one_of(st.none(), st.integers(0, 3600).map(lambda s: NOW - timedelta(seconds=s)))
histories = st.builds(History, desired=st.one_of(st.none(), st.integers(0, 40)), changed_at=ago, above_since=ago)
histories_down = st.builds(History, desired=st.one_of(st.none(), st.integers(0, 40)), changed_at=ago, below_since=ago)
any_history = st.one_of(histories, histories_down)


@st.composite
def scaling(draw) -> tuple[int, int]:
    low = draw(st.integers(0, 8))
    return low, draw(st.integers(low, 32))


def _decide(bounds, live, load, capacity, history, idle=None, now=NOW, policy=POLICY):
    return decide(
        min_replicas=bounds[0],
        max_replicas=bounds[1],
        idle_timeout_s=idle,
        live=live,
        load=load,
        capacity=capacity,
        history=history,
        now=now,
        policy=policy,
    )


@settings(max_examples=600, deadline=None)
@given(scaling(), st.integers(0, 40), loads, capacities, any_history, st.one_of(st.none(), st.floats(0, 900)))
def test_never_outside_min_and_max(bounds, live, load, capacity, history, idle):
    d = _decide(bounds, live, load, capacity, history, idle)
    assert bounds[0] <= d.desired <= bounds[1]
    if live > 0:
        # A model with a replica is never taken to zero by load; that is the idle timeout's.
        assert d.desired >= min(1, bounds[1])


@settings(max_examples=600, deadline=None)
@given(scaling(), st.integers(0, 40), loads, loads, capacities, any_history)
def test_monotone_in_load(bounds, live, a, b, capacity, history):
    small, big = sorted((a, b), key=lambda x: (x.requests, x.tokens_per_s))
    if small.tokens_per_s > big.tokens_per_s:
        big = Load(in_flight=big.in_flight, waiting=big.waiting, tokens_per_s=small.tokens_per_s)
    less, more = _decide(bounds, live, small, capacity, history), _decide(bounds, live, big, capacity, history)
    assert less.desired <= more.desired


@settings(max_examples=600, deadline=None)
@given(scaling(), st.integers(0, 40), loads, capacities, any_history)
def test_down_at_most_one_running_replica_at_a_time(bounds, live, load, capacity, history):
    d = _decide(bounds, live, load, capacity, history)
    # Replicas above the maximum are stopped by the scheduler, not by load.
    assert d.desired >= min(live, bounds[1]) - 1
    if d.direction == DOWN:
        assert d.desired == min(max(live, history.desired or 0), bounds[1]) - 1


def _run(bounds, capacity, series, step_s, idle=None, policy=POLICY, live_follows=True):
    """Feed a series of loads, one per reconcile ``step_s`` apart; the replicas follow each decision."""
    history, live = History(), bounds[0]
    changes = []
    for i, in_flight in enumerate(series):
        now = NOW + timedelta(seconds=i * step_s)
        d = _decide(bounds, live, Load(in_flight=in_flight), capacity, history, idle, now, policy)
        if d.desired != (history.desired if history.desired is not None else live):
            changes.append((now, d.direction, d.desired))
        history = d.history
        if live_follows:
            live = d.desired
    return changes


@settings(max_examples=300, deadline=None)
@given(
    scaling(),
    st.integers(1, 64),
    st.integers(0, 400),
    st.integers(0, 400),
    st.integers(1, 120),
    st.sampled_from([1, 5, 10]),
)
def test_an_oscillating_load_does_not_flap(bounds, concurrency, a, b, half_period, step_s):
    """Whatever the oscillation: no up then down within the cooldown, no down then up within the window."""
    capacity = Capacity("p", concurrency, measured=True)
    series = [a if (i * step_s // half_period) % 2 == 0 else b for i in range(400)]
    changes = _run(bounds, capacity, series, step_s)
    for (t0, d0, _), (t1, d1, _) in itertools.pairwise(changes):
        gap = (t1 - t0).total_seconds()
        if (d0, d1) == (UP, DOWN):
            assert gap >= POLICY.cooldown_s
        if (d0, d1) == (DOWN, UP):
            assert gap >= POLICY.up_window_s
        if (d0, d1) == (DOWN, DOWN):
            assert gap >= POLICY.cooldown_s


def test_a_load_inside_the_band_never_changes_anything():
    """Between 60 % of one fewer and 80 % of the count, an oscillation changes nothing at all."""
    capacity = Capacity("p", 10, measured=True)
    # 3 replicas: up above 24 in flight, down at or below 12. Oscillate 13 ↔ 24, each for longer than the cooldown.
    history = History(desired=3)
    for i, load in enumerate(([13] * 100 + [24] * 100) * 3):
        d = _decide((1, 8), 3, Load(in_flight=load), capacity, history, now=NOW + timedelta(seconds=5 * i))
        assert (d.desired, d.direction) == (3, HOLD)
        history = d.history


def test_the_issue_example_reads_in_numbers():
    capacity = Capacity("h100", 16, measured=True)
    first = _decide((1, 8), 2, Load(in_flight=41), capacity, History(desired=2))
    assert first.desired == 2 and first.direction == HOLD
    assert "in flight 41 on 2 replicas, capacity 16 each at 80 % → 4" in first.reason
    assert "up from 2 in 15 s" in first.reason
    later = _decide((1, 8), 2, Load(in_flight=41), capacity, first.history, now=NOW + timedelta(seconds=15))
    assert (later.desired, later.direction) == (4, UP)
    assert later.reason.startswith("in flight 41 on 2 replicas, capacity 16 each at 80 % → 4; up from 2 after 15 s")


def test_scales_down_one_at_a_time_after_the_cooldown_and_says_so():
    capacity = Capacity("h100", 16, measured=True)
    history = History(desired=4, changed_at=NOW - timedelta(hours=1))
    d = _decide((1, 8), 4, Load(in_flight=3), capacity, history)
    assert (d.desired, d.direction) == (4, HOLD) and "down to 3 in 300 s" in d.reason
    d = _decide((1, 8), 4, Load(in_flight=3), capacity, d.history, now=NOW + timedelta(seconds=300))
    assert (d.desired, d.direction) == (3, DOWN)
    assert "in flight 3 on 4 replicas, capacity 16 each: fits on 3 at 60 % for 300 s (cooldown 300 s) → 3" in d.reason
    again = _decide((1, 8), 3, Load(in_flight=3), capacity, d.history, now=NOW + timedelta(seconds=301))
    assert again.desired == 3, "the next step waits another cooldown"
    d = _decide((1, 8), 3, Load(in_flight=3), capacity, d.history, now=NOW + timedelta(seconds=600))
    assert (d.desired, d.direction) == (2, DOWN)


def test_the_idle_timeout_is_the_cooldown_when_set():
    capacity = Capacity("h100", 16, measured=True)
    history = History(desired=3, changed_at=NOW - timedelta(hours=1), below_since=NOW - timedelta(seconds=60))
    assert _decide((1, 8), 3, Load(), capacity, history, idle=60).desired == 2
    assert _decide((1, 8), 3, Load(), capacity, history, idle=None).desired == 3


def test_a_default_capacity_is_said_as_such():
    capacity = capacity_from("cpu", None, POLICY)
    assert (capacity.concurrency, capacity.measured) == (8, False)
    d = _decide((1, 4), 1, Load(in_flight=3), capacity, History())
    assert "capacity 8 each (a default: none measured for profile cpu)" in d.reason
    measured = capacity_from("h100", {"max_concurrency": 64, "tokens_per_second": 1200}, POLICY)
    assert (measured.concurrency, measured.tokens_per_s, measured.measured) == (64, 1200.0, True)
    for junk in ({"max_concurrency": "lots"}, {"max_concurrency": -1}, {"max_concurrency": True}, []):
        assert not capacity_from("x", junk, POLICY).measured


def test_tokens_per_second_count_when_measured():
    capacity = Capacity("h100", 64, tokens_per_s=1000.0, measured=True)
    d = _decide((1, 8), 1, Load(in_flight=2, tokens_per_s=2500), capacity, History(above_since=NOW - timedelta(60)))
    assert d.desired == 4 and "2500 tokens/s" in d.reason and "1000 tokens/s" in d.reason


def test_capped_at_the_maximum_and_a_model_at_zero_waits_for_demand():
    capacity = Capacity("h100", 4, measured=True)
    d = _decide((0, 3), 1, Load(in_flight=100), capacity, History(above_since=NOW - timedelta(seconds=60)))
    assert d.desired == 3 and "(needs 32; capped at the maximum of 3)" in d.reason
    assert _decide((0, 3), 0, Load(), capacity, History()).desired == 0
    assert _decide((0, 3), 2, Load(), capacity, History(desired=2, below_since=NOW - timedelta(days=1))).desired == 1


def test_replicas_gone_are_acknowledged_without_stopping_more():
    capacity = Capacity("h100", 16, measured=True)
    d = _decide((1, 8), 2, Load(in_flight=5), capacity, History(desired=4, changed_at=NOW))
    assert d.desired == 2 and "(4 were wanted; 2 remain and the load fits on them)" in d.reason
