"""inventory.reads.partitions.open_partitions: an order that holds when partitions share their start."""

from __future__ import annotations

import pytest
from django.utils import timezone

from inventory.models import FleetEvent
from inventory.reads.partitions import open_partitions

pytestmark = pytest.mark.django_db


def test_partitions_of_one_start_come_by_their_key_not_by_where_postgresql_keeps_them():
    """Partitions found in one sweep share their start, and are written widest first, so by key. Rows that
    tie came back in the order PostgreSQL keeps them, which an update can change: the sweep's lists of
    partitions ended came in either order (tests/inventory/test_sweep_at_scale.py saw both). Here the rows
    are kept in the other order than their keys': written narrowest first, with the lower key last."""
    now = timezone.now()
    for pk, group in ((30, "rack=r2"), (20, "rack=r1"), (10, "fabric north")):
        FleetEvent.objects.create(pk=pk, kind=FleetEvent.Kind.PARTITION, subject=group, started_at=now, detail={})
    FleetEvent.objects.create(kind=FleetEvent.Kind.PARTITION, subject="older", started_at=now.replace(year=2025))
    assert [e.subject for e in open_partitions()] == ["older", "fabric north", "rack=r1", "rack=r2"]
