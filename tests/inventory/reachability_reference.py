"""The reachability sweep's readings as they were before they were rewritten for a fleet gone silent at once.

Kept verbatim (commit ec9eb43, inventory/reachability.py, and
``inventory.writes.partitions.groups``, which read the whole fabric analysis) as the reference
that tests/inventory/test_sweep_at_scale.py holds the rewritten ones to: the
same decisions, whatever the fleet. ``install`` puts them in place of the new
ones for one run, with ``failure_rules.partitioned``'s old reading (kept
beside its own test, tests/placement/test_failure_rules.py).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Q

from inventory import failure_rules, reachability
from inventory.fabric_inventory import analyze_inventory
from inventory.models import FleetEvent, Node
from inventory.reachability import SweepResult, _domains_of, _members
from inventory.writes import node_locks, partitions
from tests.placement.test_failure_rules import quadratic_partitioned


def _mark_unreachable(now: datetime, grace_s: float, result: SweepResult) -> list[Node]:
    """The nodes silent past ``grace``, locked in id order and read under the lock, marked unreachable.

    Locked first (inventory/writes/node_locks.py) so that this and the
    heartbeat flusher never hold halves of each other's rows; read under the
    lock so that a node whose beat was written while this waited is not
    marked silent on what was there before.
    """

    def mark() -> list[Node]:
        with transaction.atomic():
            silent = list(
                node_locks.locked(
                    Node.objects.filter(reachable=True).filter(
                        Q(last_seen__lt=now - timedelta(seconds=grace_s)) | Q(last_seen__isnull=True)
                    )
                )
            )
            if silent:
                Node.objects.filter(pk__in=[n.pk for n in silent]).update(reachable=False, unreachable_since=now)
                # One row per silence: what flaps are counted from.
                FleetEvent.objects.bulk_create(
                    [
                        FleetEvent(kind=FleetEvent.Kind.NODE_UNREACHABLE, node=n, subject=n.name, started_at=now)
                        for n in silent
                    ]
                )
        return silent

    silent = node_locks.once_more_on_deadlock(mark, "marking nodes unreachable")
    result.unreachable = [n.name for n in silent]
    return silent


def _record_dark_domains(silent: list[Node], now: datetime, result: SweepResult) -> None:
    by_node = _domains_of([n.pk for n in silent])
    domains = {d for ds in by_node.values() for d in ds}
    if not domains:
        return
    members = _members(domains)
    reachable = set(
        Node.objects.filter(pk__in={n for m in members.values() for n in m}, reachable=True).values_list(
            "pk", flat=True
        )
    )
    already = set(
        FleetEvent.objects.filter(
            kind=FleetEvent.Kind.DOMAIN_DARK, ended_at__isnull=True, domain_id__in=domains
        ).values_list("domain_id", flat=True)
    )
    for domain_id in sorted(domains - already):
        nodes = members.get(domain_id, set())
        if len(nodes) >= 2 and not nodes & reachable:
            event = FleetEvent.objects.create(
                kind=FleetEvent.Kind.DOMAIN_DARK,
                domain_id=domain_id,
                subject=str(domain_id),
                started_at=now,
                detail={"nodes": sorted(nodes)},
            )
            result.domains_dark.append(event.subject)


def _close_domains_that_answer(now: datetime, result: SweepResult) -> None:
    open_events = list(FleetEvent.objects.filter(kind=FleetEvent.Kind.DOMAIN_DARK, ended_at__isnull=True))
    if not open_events:
        return
    members = _members([e.domain_id for e in open_events])
    for event in open_events:
        nodes = members.get(event.domain_id, set())
        if Node.objects.filter(pk__in=nodes, reachable=True).exists():
            event.ended_at = now
            event.save(update_fields=["ended_at"])
            result.domains_back.append(event.subject)


def _mark_lost(now: datetime, lost_after_s: float, domain_lost_after_s: float, result: SweepResult) -> None:
    held = partitions.held_nodes()
    candidates = [
        n
        for n in Node.objects.filter(reachable=False, lost=False, unreachable_since__isnull=False)
        if n.name not in held
    ]
    if not candidates:
        return
    dark = set(
        FleetEvent.objects.filter(kind=FleetEvent.Kind.DOMAIN_DARK, ended_at__isnull=True).values_list(
            "domain_id", flat=True
        )
    )
    by_node = _domains_of([n.pk for n in candidates])
    lost = []
    for node in candidates:
        patience = domain_lost_after_s if by_node.get(node.pk, set()) & dark else lost_after_s
        if now - node.unreachable_since >= timedelta(seconds=patience):
            lost.append(node)
    if not lost:
        return

    def mark() -> list[Node]:
        # Locked in id order and read again under the lock, like the silent above: a node that beat
        # while this was deciding is reachable now, and stays so.
        with transaction.atomic():
            still = list(
                node_locks.locked(Node.objects.filter(pk__in=[n.pk for n in lost], reachable=False, lost=False))
            )
            if still:
                Node.objects.filter(pk__in=[n.pk for n in still]).update(lost=True)
                FleetEvent.objects.bulk_create(
                    [FleetEvent(kind=FleetEvent.Kind.NODE_LOST, node=n, subject=n.name, started_at=now) for n in still]
                )
        return still

    result.lost = [n.name for n in node_locks.once_more_on_deadlock(mark, "marking nodes lost")]


def groups(labels, now=None) -> dict[str, set[str]]:
    """``inventory.writes.partitions.groups``, its fabrics read from the whole fabric analysis."""
    names = list(Node.objects.values_list("name", "labels"))
    out: dict[str, set[str]] = {partitions.FLEET: {n for n, _ in names}}
    report = analyze_inventory(now)
    for name, _ in names:
        key = report.fabric_of(name)
        if key is not None:
            physical = report.fabric(key)
            out.setdefault(f"fabric {physical.label if physical else key}", set()).add(name)
    for label in labels:
        for name, node_labels in names:
            value = node_labels.get(label) if isinstance(node_labels, dict) else None
            if value not in (None, ""):
                out.setdefault(f"{label}={value}", set()).add(name)
    return out


def install(monkeypatch) -> None:
    """The old readings in place of the new, until the test ends."""
    for name in ("_mark_unreachable", "_record_dark_domains", "_close_domains_that_answer", "_mark_lost"):
        monkeypatch.setattr(reachability, name, globals()[name])
    monkeypatch.setattr(failure_rules, "partitioned", quadratic_partitioned)
    monkeypatch.setattr(partitions, "groups", groups)
