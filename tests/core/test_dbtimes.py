"""Times read as microseconds give the whole seconds the datetimes gave, in the database and out of it."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta, timezone

import pytest
from django.utils import timezone as django_timezone

from core import dbtimes
from core.models import Finding


def old_way(now: datetime, then: datetime) -> int:
    return max(0, int((now - then).total_seconds()))


def test_whole_seconds_since_is_what_total_seconds_gave_at_every_edge():
    now = datetime(2026, 12, 3, 9, 0, 0, 123456, tzinfo=UTC)
    rng = random.Random(16)
    spans = [0, 1, 999_999, 1_000_000, 1_000_001, -1, -999_999, -1_000_000, -1_000_001, 86_400 * 10**6 - 1]
    spans += [k * 10**6 + d for k in (1, 59, 3599, 86_399, 10**8, 3 * 10**9) for d in (-1, 0, 1)]
    spans += [rng.randrange(-(10**12), 10**16) for _ in range(2000)]
    for span in spans:
        then = now - timedelta(microseconds=span)
        got = dbtimes.whole_seconds_since(dbtimes.now_microseconds(now), dbtimes.now_microseconds(then))
        assert got == old_way(now, then), span


def test_a_datetime_in_another_zone_is_the_same_instant():
    then = datetime(2026, 1, 1, 12, 0, 0, 5, tzinfo=timezone(timedelta(hours=-5)))
    assert dbtimes.now_microseconds(then) == dbtimes.now_microseconds(then.astimezone(UTC))


@pytest.mark.django_db
def test_the_database_reads_the_microseconds_python_would_have_computed():
    now = django_timezone.now()
    times = [now - timedelta(microseconds=s) for s in (0, 1, 999_999, 10**6, 86_400 * 10**6 + 7, 3 * 10**13)]
    for i, at in enumerate(times):
        Finding.objects.create(kind="k", subject=str(i), message="m", first_seen=at, last_seen=at)
    rows = dbtimes.with_microseconds(Finding.objects.order_by("subject"), seen_us="first_seen", gone_us="resolved_at")
    got = list(rows.values_list("seen_us", "gone_us"))
    assert got == [(dbtimes.now_microseconds(at), None) for at in times]
