"""The partitions open now, as the summary API, ``ctl status`` and the console show them."""

from __future__ import annotations

from datetime import datetime

from inventory.models import FleetEvent


def open_partitions() -> list[FleetEvent]:
    """Every open partition event, oldest first; those of one start in the order they were found (widest first).

    Partitions found in one sweep often share their start (their nodes fell
    silent together), and PostgreSQL returns rows that tie in whatever order
    it finds them, which an update of one changes: the lists a sweep returns
    (which partitions ended) would come in either order.
    """
    events = FleetEvent.objects.filter(kind=FleetEvent.Kind.PARTITION, ended_at__isnull=True)
    return list(events.order_by("started_at", "pk"))


def describe(event: FleetEvent) -> dict:
    """One partition: ``{"group", "nodes", "members", "since", "until"}``.

    ``since`` and ``until`` are aware datetimes; ``until`` — when it ends as
    losses — is None for one that holds until answered or resumed (the whole
    fleet, the bound turned off, or recorded before there was a bound).
    """
    until = event.detail.get("until")
    try:
        until = datetime.fromisoformat(until) if isinstance(until, str) else None
    except ValueError:
        until = None
    return {
        "group": event.subject,
        "nodes": list(event.detail.get("nodes", [])),
        "members": int(event.detail.get("members", 0) or 0),
        "since": event.started_at,
        "until": until,
    }


def active() -> list[dict]:
    """Every open partition, oldest first; empty when moves run at the normal rate."""
    return [describe(e) for e in open_partitions()]
