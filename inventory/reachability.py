"""Which nodes are answering, and when silence means what was placed on them is gone.

Two stages, because a blip must move nothing:

- *unreachable*: no heartbeat for ``grace``. Shown at once on every page.
- *lost*: unreachable for ``lost_after`` more. Only then does placement treat
  the node's replicas as gone and place them elsewhere.

A whole NVLink domain falling silent together is almost never eighteen
machines dying: it is a fabric manager restart or a rack switch. It is
recorded as one event, and its nodes get ``domain_lost_after`` instead, so
that a thirty-second outage of a rack moves no replica.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db.models import Q

from inventory.models import GPU, FleetEvent, Node

GRACE_S = 20.0
LOST_AFTER_S = 60.0
DOMAIN_LOST_AFTER_S = 300.0


@dataclass
class SweepResult:
    unreachable: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    domains_dark: list[str] = field(default_factory=list)
    domains_back: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.unreachable or self.lost or self.domains_dark or self.domains_back)


def _domains_of(node_ids) -> dict[int, set[int]]:
    """node id → the NVLink domains its cards have joined."""
    out: dict[int, set[int]] = {}
    rows = GPU.objects.filter(node_id__in=node_ids, domain__isnull=False).values_list("node_id", "domain_id")
    for node_id, domain_id in rows:
        out.setdefault(node_id, set()).add(domain_id)
    return out


def _members(domain_ids) -> dict[int, set[int]]:
    out: dict[int, set[int]] = {}
    rows = GPU.objects.filter(domain_id__in=domain_ids).values_list("domain_id", "node_id").distinct()
    for domain_id, node_id in rows:
        out.setdefault(domain_id, set()).add(node_id)
    return out


def _mark_unreachable(now: datetime, grace_s: float, result: SweepResult) -> list[Node]:
    silent = list(
        Node.objects.filter(reachable=True).filter(
            Q(last_seen__lt=now - timedelta(seconds=grace_s)) | Q(last_seen__isnull=True)
        )
    )
    if silent:
        Node.objects.filter(pk__in=[n.pk for n in silent]).update(reachable=False, unreachable_since=now)
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
    candidates = list(Node.objects.filter(reachable=False, lost=False, unreachable_since__isnull=False))
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
    if lost:
        Node.objects.filter(pk__in=[n.pk for n in lost]).update(lost=True)
        FleetEvent.objects.bulk_create(
            [FleetEvent(kind=FleetEvent.Kind.NODE_LOST, node=n, subject=n.name, started_at=now) for n in lost]
        )
        result.lost = [n.name for n in lost]


def sweep(
    now: datetime,
    grace_s: float = GRACE_S,
    lost_after_s: float = LOST_AFTER_S,
    domain_lost_after_s: float = DOMAIN_LOST_AFTER_S,
) -> SweepResult:
    """One pass: mark the silent unreachable, record dark domains, mark the long-silent lost."""
    result = SweepResult()
    _close_domains_that_answer(now, result)
    silent = _mark_unreachable(now, grace_s, result)
    if silent:
        _record_dark_domains(silent, now, result)
    _mark_lost(now, lost_after_s, domain_lost_after_s, result)
    return result
