"""The partitions open now, as the summary API, ``ctl status`` and the console show them."""

from __future__ import annotations

from inventory.models import FleetEvent


def open_partitions() -> list[FleetEvent]:
    """Every open partition event, oldest first."""
    return list(FleetEvent.objects.filter(kind=FleetEvent.Kind.PARTITION, ended_at__isnull=True).order_by("started_at"))


def describe(event: FleetEvent) -> dict:
    """One partition: ``{"group", "nodes", "members", "since"}`` (``since`` an aware datetime)."""
    return {
        "group": event.subject,
        "nodes": list(event.detail.get("nodes", [])),
        "members": int(event.detail.get("members", 0) or 0),
        "since": event.started_at,
    }


def active() -> list[dict]:
    """Every open partition, oldest first; empty when moves run at the normal rate."""
    return [describe(e) for e in open_partitions()]
