"""A periodic task's unbroken stretch of passes: what lets the reachability sweep tell its own blindness
from a node's silence (core.continuity)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import transaction
from hypothesis import given
from hypothesis import strategies as st

from core.continuity import stretch_start, unbroken_since
from core.models import TaskRun

T0 = datetime(2026, 12, 2, 6, 0, tzinfo=UTC)


def at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def test_the_first_pass_ever_starts_a_stretch():
    assert stretch_start(None, None, at(0), 20) == at(0)


def test_a_pass_within_the_gap_continues_the_stretch_and_one_past_it_starts_another():
    assert stretch_start(at(10), at(0), at(25), 20) == at(0)
    assert stretch_start(at(10), at(0), at(30), 20) == at(0)
    assert stretch_start(at(10), at(0), at(30.001), 20) == at(30.001)


def test_a_clock_stepped_back_is_not_blindness():
    assert stretch_start(at(100), at(0), at(50), 20) == at(0)
    assert stretch_start(at(100), at(60), at(50), 20) == at(50)


@given(
    passes=st.lists(st.floats(min_value=0, max_value=120, allow_nan=False), min_size=1, max_size=40),
    gap=st.floats(min_value=0.5, max_value=60),
)
def test_the_stretch_starts_at_the_last_pass_that_followed_a_gap_longer_than_it(passes, gap):
    # Passes at increasing times, each `passes[i]` seconds after the one before.
    times = []
    t = 0.0
    for step in passes:
        t += step
        times.append(at(t))
    previous = since = None
    for now in times:
        since = stretch_start(previous, since, now, gap)
        previous = now
    # The reference: walk back from the last pass while each step is within the gap.
    start = len(times) - 1
    while start > 0 and times[start] - times[start - 1] <= timedelta(seconds=gap):
        start -= 1
    assert since == times[start]
    assert since <= times[-1]


@pytest.mark.django_db(transaction=True)
def test_a_pass_that_rolls_back_does_not_count_as_watching():
    assert unbroken_since("t", at(0), 20) == at(0)
    assert unbroken_since("t", at(5), 20) == at(0)
    with pytest.raises(RuntimeError), transaction.atomic():
        unbroken_since("t", at(10), 20)
        raise RuntimeError("the database went away mid-pass")
    assert TaskRun.objects.get(name="t").last_pass == at(5)
    # 20 s after the last pass that committed: still one stretch; 20.5 s: a new one.
    assert unbroken_since("t", at(25), 20) == at(0)
    assert unbroken_since("t", at(45.5), 20) == at(45.5)
