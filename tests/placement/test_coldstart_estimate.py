"""The cold-start estimate (placement.scheduling.coldstart): medians of measured starts, the node's own first,
no fetch where the weights are, the defaults said as such; and the time left, never growing as a start goes on."""

from __future__ import annotations

import statistics

from hypothesis import given
from hypothesis import strategies as st

from placement.scheduling.coldstart import (
    DEFAULT_FETCH_S,
    DEFAULT_LOAD_S,
    OVERDUE_S,
    Estimate,
    Progress,
    Sample,
    describe,
    estimate,
    remaining,
)

seconds = st.floats(min_value=0, max_value=7 * 86400, allow_nan=False)
nodes = st.sampled_from(["a", "b", "c"])
samples = st.lists(st.builds(Sample, nodes, seconds, seconds, st.booleans()), max_size=30)


def test_nothing_measured_is_the_defaults_said_as_such():
    cold = estimate([], "a", False)
    assert (cold.fetch_s, cold.load_s, cold.measured) == (DEFAULT_FETCH_S, DEFAULT_LOAD_S, False)
    assert "no start of this model and profile measured yet" in cold.basis
    warm = estimate([], "a", True, default_load_s=7)
    assert (warm.fetch_s, warm.load_s) == (0, 7) and "holds the weights" in warm.basis


def test_the_nodes_own_starts_beat_the_fleets_and_a_local_start_has_no_fetch():
    history = [Sample("a", 100, 40, False), Sample("b", 10, 5, False), Sample("b", 0.1, 7, True)]
    on_b = estimate(history, "b", False)
    assert on_b.load_s == 6 and on_b.fetch_s == 10, "b's own load median; b's own download, not its local start"
    assert "on b" in on_b.basis
    on_c = estimate(history, "c", True)
    assert on_c.load_s == 7 and on_c.fetch_s == 0 and "on any node" in on_c.basis
    unknown_fetch = estimate([Sample("a", 0.2, 9, True)], "a", False)
    assert unknown_fetch.fetch_s == DEFAULT_FETCH_S and not unknown_fetch.measured, "no download measured"


@given(samples, st.one_of(st.none(), nodes), st.booleans())
def test_the_estimate_is_a_median_of_what_was_measured(history, node, holds):
    est = estimate(history, node, holds)
    downloads = any(not s.weights_local for s in history)
    assert est.total_s >= 0 and est.measured == (bool(history) and (holds or downloads))
    if holds:
        assert est.fetch_s == 0
    if history:
        mine = [s for s in history if s.node == node] or history
        assert est.load_s == statistics.median(s.load_s for s in mine)
        assert min(s.load_s for s in history) <= est.load_s <= max(s.load_s for s in history)


@given(samples.filter(bool), nodes, st.booleans(), seconds)
def test_one_more_slow_start_never_lowers_the_measured_estimate(history, node, holds, slowest):
    before = estimate(history, node, holds)
    slow = max([slowest, *(s.load_s for s in history)])
    after = estimate([Sample(node, before.fetch_s, slow, holds), *history], node, holds)
    assert after.load_s >= before.load_s


progress_states = st.sampled_from(["pending", "fetching", "starting"])


@given(
    st.builds(Estimate, seconds, seconds, st.just("x"), st.booleans()),
    progress_states,
    seconds,
    seconds,
)
def test_time_left_never_grows_as_a_phase_goes_on(est, state, elapsed, more):
    def left(t: float) -> float:
        if state == "fetching":
            return remaining(est, Progress(state, fetch_s=t))
        return remaining(est, Progress(state, load_s=t))

    now, later = left(elapsed), left(elapsed + more)
    assert 1 <= now <= est.total_s + OVERDUE_S + 1
    if state != "pending":
        # Past its estimate a phase is "overdue" (OVERDUE_S more), which never exceeds what it was before.
        assert later <= max(now, OVERDUE_S + (est.load_s if state == "fetching" else 0)) + 1e-9
    assert remaining(est, Progress("ready")) == 0


def test_a_download_of_known_size_is_extrapolated_from_its_own_speed():
    est = Estimate(fetch_s=10, load_s=20, basis="x", measured=True)
    # A quarter done in 30 s: 90 s more, whatever the history said, then the engine's 20.
    assert remaining(est, Progress("fetching", fetch_s=30, bytes_done=25, bytes_total=100)) == 110
    sentence = describe("m", "cpu-a", Progress("fetching", bytes_done=4 * 10**9, bytes_total=16 * 10**9), 110)
    assert sentence == "m: replica starting on cpu-a, fetching the weights (4.0 of 16.0 GB), about 110 s left"
    assert describe("m", "cpu-a", Progress("starting"), 40) == (
        "m: replica starting on cpu-a, loading the engine, about 40 s left"
    )
    assert "not placed on a node yet" in describe("m", None, Progress("pending"), 60)
