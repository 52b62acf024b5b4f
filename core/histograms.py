"""Histograms kept in the database, so that every process adds to the same figure and any can report it.

A Prometheus histogram in process memory shows only what that process saw;
the reconciler runs in whichever Celery worker picks it up, and /metrics is
answered by the web process. One row per histogram, updated under a row lock:
observations come every few seconds at most, so contention is nil.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

from django.db import transaction
from django.utils import timezone

from core.models import SharedHistogram


@dataclass(frozen=True)
class Snapshot:
    """A histogram as Prometheus wants it: cumulative counts per upper bound, +Inf last."""

    buckets: list[tuple[str, int]]
    total: float
    count: int


def bucket_of(bounds: Sequence[float], value: float) -> int:
    """The index of the bucket ``value`` falls in: the first bound ≥ value; len(bounds) for +Inf."""
    return bisect.bisect_left(bounds, value)


def cumulative(bounds: Sequence[float], counts: Sequence[int]) -> list[tuple[str, int]]:
    """Per-bucket counts as Prometheus's cumulative ``le`` buckets, ending with +Inf."""
    out, running = [], 0
    for le, n in zip([*(str(float(b)) for b in bounds), "+Inf"], counts, strict=True):
        running += n
        out.append((le, running))
    return out


def observe(name: str, value: float, bounds: Sequence[float]) -> None:
    """Add one observation. A change of ``bounds`` starts the histogram afresh (old buckets cannot be split)."""
    bounds = sorted(float(b) for b in bounds)
    with transaction.atomic():
        row, _ = SharedHistogram.objects.select_for_update().get_or_create(
            name=name, defaults={"bounds": bounds, "counts": [0] * (len(bounds) + 1)}
        )
        if row.bounds != bounds or len(row.counts) != len(bounds) + 1:
            row.bounds, row.counts, row.total, row.count = bounds, [0] * (len(bounds) + 1), 0.0, 0
        row.counts[bucket_of(bounds, value)] += 1
        row.total += value
        row.count += 1
        row.updated_at = timezone.now()
        row.save()


def snapshot(name: str, bounds: Sequence[float]) -> Snapshot:
    """The histogram as stored; all zeros over ``bounds`` when nothing was observed yet."""
    row = SharedHistogram.objects.filter(name=name).first()
    if row is None:
        bounds = sorted(float(b) for b in bounds)
        return Snapshot(cumulative(bounds, [0] * (len(bounds) + 1)), 0.0, 0)
    return Snapshot(cumulative(row.bounds, row.counts), row.total, row.count)
