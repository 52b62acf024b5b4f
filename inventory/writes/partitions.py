"""Partitions as rows: opened by the reachability sweep, closed when the group answers or an operator resumes.

A partition is a ``FleetEvent`` of kind ``partition`` (its group the subject,
its silent nodes and the group's size in ``detail``) and one open
``core.Finding`` of kind ``partition`` about the same group, written and
resolved in the same step. While it is open, none of its nodes is marked lost
(``inventory.reachability``), so placement moves nothing off them.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta

from django.db import transaction

from core.models import AuditEntry, Finding, Severity
from inventory import failure_rules
from inventory.fabric_inventory import node_fabric_names
from inventory.models import FleetEvent, Node
from inventory.reads.partitions import describe, open_partitions

KIND = "partition"
FLEET = "the fleet"
# Nodes of a partition that ended are not found partitioned again in the same silence for this long.
REMEMBER_ENDED = timedelta(days=1)


def groups(labels: Iterable[str]) -> dict[str, set[str]]:
    """Every group that can be cut off together, widest first: the fleet, each InfiniBand fabric, each label value."""
    names = list(Node.objects.values_list("name", "labels"))
    out: dict[str, set[str]] = {FLEET: {n for n, _ in names}}
    # Each node's fabric by the label the fabric analysis gives it, without the rest of the analysis.
    fabrics = node_fabric_names()
    for name, _ in names:
        label = fabrics.get(name)
        if label is not None:
            out.setdefault(f"fabric {label}", set()).add(name)
    for label in labels:
        for name, node_labels in names:
            value = node_labels.get(label) if isinstance(node_labels, dict) else None
            if value not in (None, ""):
                out.setdefault(f"{label}={value}", set()).add(name)
    return out


def held_nodes() -> set[str]:
    """The nodes of every open partition: none of them is marked lost while it lasts."""
    return {n for e in open_partitions() for n in e.detail.get("nodes", [])}


def settled_nodes(silent: dict[str, datetime], now: datetime) -> set[str]:
    """Nodes of a partition that ended (answered or resumed) still in the same silence: failures from then on.

    ``silent`` maps each silent node to when it went silent.
    """
    out = set()
    for event in FleetEvent.objects.filter(kind=FleetEvent.Kind.PARTITION, ended_at__gte=now - REMEMBER_ENDED):
        for name in event.detail.get("nodes", []):
            if name in silent and silent[name] <= event.ended_at:
                out.add(name)
    return out


@transaction.atomic
def open_partition(p: failure_rules.Partition, now: datetime, until: datetime | None = None) -> FleetEvent:
    """Record one partition and raise its finding; the silences it explains stop counting as flaps.

    ``until`` is when it ends as losses (``failure_rules.hold_until``), kept
    with it so that the finding, the summary and the sweep that ends it all
    read the same time; None holds it until answered or resumed.
    """
    detail = {"nodes": list(p.nodes), "members": p.members, "found_at": now.isoformat()}
    detail["until"] = until.isoformat() if until is not None else None
    event = FleetEvent.objects.create(
        kind=FleetEvent.Kind.PARTITION, subject=p.group[:200], started_at=p.started_at, detail=detail
    )
    message = failure_rules.partition_message(p.group, p.nodes, p.members, p.started_at, until)
    Finding.objects.update_or_create(
        kind=KIND,
        subject=p.group[:200],
        resolved_at=None,
        defaults={"message": message, "severity": Severity.CRITICAL, "last_seen": now},
        create_defaults={
            "message": message,
            "severity": Severity.CRITICAL,
            "first_seen": now,
            "last_seen": now,
        },
    )
    FleetEvent.objects.filter(
        kind=FleetEvent.Kind.NODE_UNREACHABLE, node__name__in=p.nodes, started_at__gte=p.started_at
    ).update(detail={"partition": p.group})
    return event


def close(event: FleetEvent, now: datetime, why: str, **detail: object) -> None:
    """End one partition and resolve its finding."""
    event.ended_at = max(now, event.started_at)
    event.detail = {**event.detail, "ended": why, **detail}
    event.save(update_fields=["ended_at", "detail"])
    Finding.objects.open().filter(kind=KIND, subject=event.subject).update(resolved_at=now)


def close_those_that_answer(now: datetime, share: float) -> list[str]:
    """Partitions of which no more than ``share`` of the nodes are still silent end; their groups."""
    events = open_partitions()
    if not events:
        return []
    silent = set(Node.objects.filter(reachable=False).values_list("name", flat=True))
    ended = []
    with transaction.atomic():
        for event in events:
            if failure_rules.partition_over(event.detail.get("nodes", []), silent, share=share):
                close(event, now, "answered")
                ended.append(event.subject)
    return ended


def close_those_held_past(now: datetime) -> list[str]:
    """Partitions held past their bound end: their nodes still silent are lost at this sweep; their groups."""
    ended = []
    with transaction.atomic():
        for event in open_partitions():
            until = describe(event)["until"]
            if failure_rules.held_past(until, now):
                close(event, now, "held past the bound", until=until.isoformat())
                ended.append(event.subject)
    return ended


def resume_moves(*, actor: str, now: datetime, detail: dict | None = None) -> list[dict]:
    """An operator says moves resume: every open partition ends, its finding resolves, one audit row says so.

    Its nodes still silent are from then on failures like any other: lost
    at the next sweep (their grace has long passed) and moved at the normal
    rate. Returns the partitions ended, ``[{"group", "nodes", "since"}]``.
    """
    with transaction.atomic():
        events = list(
            FleetEvent.objects.select_for_update().filter(kind=FleetEvent.Kind.PARTITION, ended_at__isnull=True)
        )
        ended = [describe(e) for e in events]
        for event in events:
            close(event, now, "resumed", resumed_by=actor)
        AuditEntry.record(actor, "resume-moves", FLEET, {"partitions": [e["group"] for e in ended], **(detail or {})})
    return ended
