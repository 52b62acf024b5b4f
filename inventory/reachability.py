"""Which nodes are answering, and when silence means what was placed on them is gone.

Two stages, because a blip must move nothing:

- *unreachable*: no heartbeat for ``grace``. Shown at once on every page.
- *lost*: unreachable for ``lost_after`` more. Only then does placement treat
  the node's replicas as gone and place them elsewhere.

A whole NVLink domain falling silent together is almost never eighteen
machines dying: it is a fabric manager restart or a rack switch. It is
recorded as one event, and its nodes get ``domain_lost_after`` instead, so
that a thirty-second outage of a rack moves no replica.

Any other group going silent together — more than a share of the fleet, of
an InfiniBand fabric, or of a labelled group such as a rack, within one
window — is a *partition* (``inventory.failure_rules``): it is recorded once,
with a finding, and none of its nodes is marked lost until it ends: most of
them answer again, an operator resumes moves, or it lasts past
``LLMGW_PARTITION_HOLD_S`` (unless it is the whole fleet: then the control
host is the likelier one cut off, and it holds until answered or resumed). Each silence is recorded
too; a node that went silent and came back too often in a window is
cordoned, with the reason in the audit log.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Q

from inventory import failure_rules
from inventory.models import GPU, FleetEvent, Node, NodeState
from inventory.reads import flaps
from inventory.writes import node_locks, partitions
from inventory.writes.states import set_node_state

GRACE_S = 20.0
LOST_AFTER_S = 60.0
DOMAIN_LOST_AFTER_S = 300.0
ACTOR = "reachability"
KEEP_SILENCES = timedelta(days=1)


@dataclass(frozen=True)
class LossRules:
    """What makes a partition and a flapper (``inventory.failure_rules``); read from the environment by the task."""

    share: float = failure_rules.PARTITION_SHARE
    window_s: float = failure_rules.PARTITION_WINDOW_S
    min_nodes: int = failure_rules.PARTITION_MIN_NODES
    labels: tuple[str, ...] = ("rack",)
    hold_s: float = failure_rules.PARTITION_HOLD_S
    flaps_to_cordon: int = failure_rules.FLAPS_TO_CORDON
    flap_window_s: float = failure_rules.FLAP_WINDOW_S


@dataclass
class SweepResult:
    unreachable: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    domains_dark: list[str] = field(default_factory=list)
    domains_back: list[str] = field(default_factory=list)
    partitions: list[str] = field(default_factory=list)
    partitions_over: list[str] = field(default_factory=list)
    # Partitions held past LLMGW_PARTITION_HOLD_S: their nodes still silent are lost from now on.
    partitions_expired: list[str] = field(default_factory=list)
    cordoned: list[str] = field(default_factory=list)
    # Set when this pass judged no silence, having watched for less than one grace (core.continuity):
    # the moment from which it will.
    judging_from: datetime | None = None

    @property
    def changed(self) -> bool:
        return bool(
            self.unreachable
            or self.lost
            or self.domains_dark
            or self.domains_back
            or self.partitions
            or self.partitions_over
            or self.partitions_expired
            or self.cordoned
        )


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


def _mark_unreachable(now: datetime, grace_s: float, result: SweepResult) -> list[tuple[int, str]]:
    """The nodes silent past ``grace``, locked in id order and read under the lock, marked unreachable: (pk, name).

    Locked first (inventory/writes/node_locks.py) so that this and the
    heartbeat flusher never hold halves of each other's rows; read under the
    lock so that a node whose beat was written while this waited is not
    marked silent on what was there before. Only their ids and names are
    read: a whole Node decodes a dozen JSON columns, which for a fleet gone
    silent at once was seconds of the sweep's CPU.
    """

    def mark() -> list[tuple[int, str]]:
        with transaction.atomic():
            silent = list(
                node_locks.locked(
                    Node.objects.filter(reachable=True).filter(
                        Q(last_seen__lt=now - timedelta(seconds=grace_s)) | Q(last_seen__isnull=True)
                    )
                ).values_list("pk", "name")
            )
            if silent:
                Node.objects.filter(pk__in=[pk for pk, _ in silent]).update(reachable=False, unreachable_since=now)
                # One row per silence: what flaps are counted from.
                FleetEvent.objects.bulk_create(
                    [
                        FleetEvent(kind=FleetEvent.Kind.NODE_UNREACHABLE, node_id=pk, subject=name, started_at=now)
                        for pk, name in silent
                    ]
                )
        return silent

    silent = node_locks.once_more_on_deadlock(mark, "marking nodes unreachable")
    result.unreachable = [name for _, name in silent]
    return silent


def _record_partitions(now: datetime, rules: LossRules, result: SweepResult) -> None:
    """Groups of which more than the share went silent in one window, each recorded once."""
    silent = {
        name: seen or since
        for name, seen, since in Node.objects.filter(reachable=False).values_list(
            "name", "last_seen", "unreachable_since"
        )
        if (seen or since) is not None
    }
    settled = partitions.settled_nodes(silent, now)
    held = partitions.held_nodes()
    groups = {g: members - settled for g, members in partitions.groups(rules.labels).items()}
    found = failure_rules.find_partitions(
        groups,
        {n: t for n, t in silent.items() if n not in settled},
        already=held,
        share=rules.share,
        window_s=rules.window_s,
        min_nodes=rules.min_nodes,
    )
    fleet = len(groups.get(partitions.FLEET, ()))
    for p in found:
        until = failure_rules.hold_until(p.started_at, members=p.members, fleet=fleet, hold_s=rules.hold_s)
        partitions.open_partition(p, now, until)
        result.partitions.append(p.group)


def _record_dark_domains(silent: list[tuple[int, str]], now: datetime, result: SweepResult) -> None:
    """Domains of the nodes just gone silent of which no member answers (two or more of them) open an event each.

    Written together: the queries are the same for one domain or a hundred.
    """
    by_node = _domains_of([pk for pk, _ in silent])
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
    dark = [
        FleetEvent(
            kind=FleetEvent.Kind.DOMAIN_DARK,
            domain_id=domain_id,
            subject=str(domain_id),
            started_at=now,
            detail={"nodes": sorted(members[domain_id])},
        )
        for domain_id in sorted(domains - already)
        if len(members.get(domain_id, ())) >= 2 and not members[domain_id] & reachable
    ]
    FleetEvent.objects.bulk_create(dark)
    result.domains_dark += [event.subject for event in dark]


def _close_domains_that_answer(now: datetime, result: SweepResult) -> None:
    """Dark domains of which a member answers again end, together: three queries however many there are."""
    open_events = list(
        FleetEvent.objects.filter(kind=FleetEvent.Kind.DOMAIN_DARK, ended_at__isnull=True).values_list(
            "pk", "domain_id", "subject"
        )
    )
    if not open_events:
        return
    members = _members([domain_id for _, domain_id, _ in open_events])
    answering = set(
        Node.objects.filter(pk__in={n for m in members.values() for n in m}, reachable=True).values_list(
            "pk", flat=True
        )
    )
    back = [(pk, subject) for pk, domain_id, subject in open_events if members.get(domain_id, set()) & answering]
    if back:
        FleetEvent.objects.filter(pk__in=[pk for pk, _ in back]).update(ended_at=now)
        result.domains_back += [subject for _, subject in back]


def _mark_lost(now: datetime, lost_after_s: float, domain_lost_after_s: float, result: SweepResult) -> None:
    held = partitions.held_nodes()
    # Ids, names and times only: every silent node is read at every sweep while the silence lasts.
    candidates = [
        (pk, name, since)
        for pk, name, since in Node.objects.filter(
            reachable=False, lost=False, unreachable_since__isnull=False
        ).values_list("pk", "name", "unreachable_since")
        if name not in held
    ]
    if not candidates:
        return
    dark = set(
        FleetEvent.objects.filter(kind=FleetEvent.Kind.DOMAIN_DARK, ended_at__isnull=True).values_list(
            "domain_id", flat=True
        )
    )
    by_node = _domains_of([pk for pk, _, _ in candidates])
    lost = []
    for pk, _, since in candidates:
        patience = domain_lost_after_s if by_node.get(pk, set()) & dark else lost_after_s
        if now - since >= timedelta(seconds=patience):
            lost.append(pk)
    if not lost:
        return

    def mark() -> list[tuple[int, str]]:
        # Locked in id order and read again under the lock, like the silent above: a node that beat
        # while this was deciding is reachable now, and stays so.
        with transaction.atomic():
            still = list(
                node_locks.locked(Node.objects.filter(pk__in=lost, reachable=False, lost=False)).values_list(
                    "pk", "name"
                )
            )
            if still:
                Node.objects.filter(pk__in=[pk for pk, _ in still]).update(lost=True)
                FleetEvent.objects.bulk_create(
                    [
                        FleetEvent(kind=FleetEvent.Kind.NODE_LOST, node_id=pk, subject=name, started_at=now)
                        for pk, name in still
                    ]
                )
        return still

    result.lost = [name for _, name in node_locks.once_more_on_deadlock(mark, "marking nodes lost")]


def _cordon_flappers(now: datetime, rules: LossRules, result: SweepResult) -> None:
    """Ready nodes that went silent and came back ``flaps_to_cordon`` times in the window are cordoned.

    The count is ``inventory.reads.flaps``' (partitions' silences and those
    before the node's last cordon for flapping left out).
    """
    # Silences older than any window that counts them are history nobody reads.
    keep = max(KEEP_SILENCES, timedelta(seconds=2 * rules.flap_window_s))
    FleetEvent.objects.filter(kind=FleetEvent.Kind.NODE_UNREACHABLE, started_at__lt=now - keep).delete()
    if rules.flaps_to_cordon <= 0:
        return
    found = flaps.flapping(now, rules.flap_window_s)
    for name in sorted(found):
        flapper = found[name]
        if flapper.state != NodeState.READY:
            continue
        if not failure_rules.should_cordon(flapper.returns, flaps_to_cordon=rules.flaps_to_cordon):
            continue
        count = flapper.returns
        reason = (
            f"went silent and came back {count} times in {rules.flap_window_s / 60:.0f} min "
            f"(LLMGW_FLAPS_TO_CORDON={rules.flaps_to_cordon}): cordoned so that nothing new lands on it; "
            "uncordon it once it is fixed"
        )
        set_node_state(name, "cordon", actor=ACTOR, detail={"reason": reason, "flaps": count})
        FleetEvent.objects.create(
            kind=FleetEvent.Kind.NODE_FLAPPING,
            node_id=flapper.node_id,
            subject=name,
            started_at=now,
            detail={"reason": reason},
        )
        result.cordoned.append(name)


def sweep(
    now: datetime,
    grace_s: float = GRACE_S,
    lost_after_s: float = LOST_AFTER_S,
    domain_lost_after_s: float = DOMAIN_LOST_AFTER_S,
    rules: LossRules | None = None,
    watching_since: datetime | None = None,
) -> SweepResult:
    """One pass: end partitions that answer or were held past their bound, mark the silent unreachable, record
    dark domains and partitions, mark the long-silent lost (but not a held partition's), cordon flappers.

    ``watching_since`` is when the sweeps began to run without a break longer
    than the grace (``core.continuity``); None means always. Until one grace
    has passed since then, this pass ends what answers but judges no silence:
    the sweep could not see, so neither could the serve processes write the
    beats they took, and those land within a flush of the database coming
    back. Silence across the sweep's own blindness is not the node's.
    """
    rules = rules or LossRules()
    result = SweepResult()
    _close_domains_that_answer(now, result)
    result.partitions_over = partitions.close_those_that_answer(now, rules.share)
    result.partitions_expired = partitions.close_those_held_past(now)
    if watching_since is not None and now - watching_since < timedelta(seconds=grace_s):
        result.judging_from = watching_since + timedelta(seconds=grace_s)
        return result
    silent = _mark_unreachable(now, grace_s, result)
    if silent:
        _record_dark_domains(silent, now, result)
        _record_partitions(now, rules, result)
    _mark_lost(now, lost_after_s, domain_lost_after_s, result)
    _cordon_flappers(now, rules, result)
    return result
