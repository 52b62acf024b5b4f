"""Card health that acts: record each report's new problems, and apply inventory.health_actions' decision.

Called by ingest for every full report (changed or not, so that a clean window can end
without the report changing). The decision is the pure module's; this module only reads its
inputs from the rows and writes its outputs:

* a card held (a :class:`~inventory.models.CardHold`): placement keeps it out and moves any
  replica on it elsewhere, replacement first (``inventory.signals.card_holds_changed``);
* a node cordoned with the reason (``set_node_state``, actor ``health``; ``Node.health_cordon``);
* either undone once the card or the node has been clean for the clean window.

Each action is an audit row (actor ``health``); observability's sweep makes each hold and
health cordon a finding while it lasts.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import Count

from core.models import AuditEntry
from core.rowinsert import insert_rows
from inventory import health_actions as A
from inventory import health_rules as H
from inventory import signals
from inventory.loss_settings import health_settings
from inventory.models import GPU, CardHealthEvent, CardHold, Node, NodeState
from inventory.reads.nodes import HEALTH_ACTOR
from inventory.writes.states import set_node_state

log = logging.getLogger(__name__)
ACTOR = HEALTH_ACTOR  # the audit rows ctl node lists (inventory.reads.nodes.health_actions)
WHAT_CHARS = 300  # an event's words as stored; the driver's messages are a line
# A card's summary of the events over its cap (health_actions.over_cap): one row a card, found by these words.
SUMMARY = "Over the cap: "
_SUMMARY = re.compile(r"^Over the cap: (\d+) more .*?; the gravest: (.*)$", re.S)


def settings() -> A.Settings:
    """The rules' settings from ``LLMGW_HEALTH_WINDOW_S``, ``LLMGW_HEALTH_CORDON_AFTER``, ``LLMGW_HEALTH_CLEAN_S``."""
    return health_settings()


def card_facts(gpu: GPU) -> dict[str, Any]:
    """A GPU row's health columns in a report entry's shape (what health_rules.card_problems reads)."""
    return {
        "health": gpu.health,
        "ecc": gpu.ecc,
        "remapped_rows": gpu.remapped_rows,
        "retired_pages": gpu.retired_pages,
        "fabric": {"problems": gpu.fabric_problems},
    }


def problems_before(node: Node) -> dict[int, set[H.Problem]]:
    """Each stored card's problems, read before a report replaces them."""
    return {g.index: set(H.card_problems(card_facts(g))) for g in GPU.objects.filter(node=node)}


def _words(problem: H.Problem) -> str:
    if problem.kind is H.Kind.XID:
        return f"Xid {problem.code}" + (f": {problem.message}" if problem.message else "")
    return str(problem.kind) + (f": {problem.message}" if problem.message else "")


def _xid_time(value: Any, now: datetime) -> datetime:
    try:
        at = datetime.fromtimestamp(float(value), tz=UTC)
    except (TypeError, ValueError, OverflowError, OSError):
        return now
    return min(at, now)  # a clock ahead of ours does not date a problem in the future


def new_events(
    node: Node,
    entries: Iterable[Mapping[str, Any]],
    before: Mapping[int, set[H.Problem]],
    now: datetime,
    stored: set[tuple[int, int, datetime]] | None = None,
) -> list[CardHealthEvent]:
    """The events a report brings: each Xid it lists not stored yet, and each other problem that appeared.

    A card that lists its Xids (``xids``) is counted from them, one event per Xid; for a card
    from an older agent, an Xid in its health words counts once, when it appears. ``stored``:
    the node's Xid events as (card, code, time), read here when not given.
    """
    if stored is None:
        stored = set(CardHealthEvent.objects.filter(node=node, xid__isnull=False).values_list("gpu_index", "xid", "at"))
    out: list[CardHealthEvent] = []
    for entry in entries:
        index = entry.get("index")
        if not isinstance(index, int):
            continue
        listed = entry.get("xids") if isinstance(entry.get("xids"), list) else None
        for xid in listed or []:
            code = xid.get("code") if isinstance(xid, dict) else None
            if not isinstance(code, int):
                continue
            at = _xid_time(xid.get("at"), now)
            if (index, code, at) in stored:
                continue
            stored.add((index, code, at))
            message = str(xid.get("message") or "")
            what = f"Xid {code}" + (f": {message}" if message else "")
            out.append(_event(node, index, at, H.xid_severity(code, message), what[:WHAT_CHARS], code))
        for problem in filter(A.card_local, H.card_problems(entry)):
            if problem in before.get(index, set()) or (listed is not None and problem.kind is H.Kind.XID):
                continue
            out.append(_event(node, index, now, H.severity(problem), _words(problem)[:WHAT_CHARS], problem.code))
    return out


def _event(node: Node, index: int, at: datetime, severity: H.Severity, what: str, xid: int | None) -> CardHealthEvent:
    return CardHealthEvent(node=node, gpu_index=index, at=at, severity=int(severity), what=what, xid=xid)


def needs_review(node: Node) -> bool:
    """Whether an unchanged report can still change something: a hold, a health cordon or events to age."""
    return (
        bool(node.health_cordon)
        or CardHealthEvent.objects.filter(node=node).exists()
        or (CardHold.objects.filter(node=node).exists())
    )


def review(
    node: Node, entries: list[Mapping[str, Any]] | None, before: Mapping[int, set[H.Problem]], now: datetime
) -> A.Decision:
    """Record the report's new events and act on the node's health; ``entries`` None: the cards as stored."""
    config = settings()
    # No savepoint: a failure here fails the report it is part of (inventory.writes.ingest).
    with transaction.atomic(savepoint=False):
        # One review of a node at a time: two would both hold the same card.
        fresh = Node.objects.select_for_update().get(pk=node.pk)
        keep_from = _keep_from(now, config)
        if entries is not None:
            _store(node, new_events(node, entries, before, now), keep_from, config)
        CardHealthEvent.objects.filter(node=node, at__lt=keep_from).delete()
        events = [_event_of(e) for e in CardHealthEvent.objects.filter(node=node)]
        cards = entries if entries is not None else [{"index": g.index, **card_facts(g)} for g in node.gpus.all()]
        showing = _showing(cards)
        holds = {h.gpu_index: h for h in CardHold.objects.filter(node=node)}
        if fresh.health_cordon and fresh.state != NodeState.CORDONED:
            # An operator changed the state since: the cordon is theirs now, not health's.
            Node.objects.filter(pk=node.pk).update(health_cordon="")
            fresh.health_cordon = ""
        decision = A.decide(events, showing, set(holds), bool(fresh.health_cordon), now, config)
        _apply(fresh, decision, holds, now)
    return decision


def review_new_node(node: Node, entries: list[Mapping[str, Any]], now: datetime) -> A.Decision:
    """:func:`review` of a node inserted in this transaction, from its first report, without reading anything.

    Such a node has nothing stored for a review to read: no events, no holds,
    no health cordon, and no other request can see (or review) it before this
    transaction commits. So its events are the report's, those older than the
    rules look back left out (review would store them and delete them at
    once), and the decision and its actions are review's.
    """
    config = settings()
    kept = _store(node, new_events(node, entries, {}, now, stored=set()), _keep_from(now, config), config, new=True)
    events = [_event_of(e) for e in sorted(kept, key=lambda e: e.at, reverse=True)]  # CardHealthEvent's order
    decision = A.decide(events, _showing(entries), set(), False, now, config)
    _apply(node, decision, {}, now)
    return decision


def _store(
    node: Node, events: list[CardHealthEvent], keep_from: datetime, config: A.Settings, new: bool = False
) -> list[CardHealthEvent]:
    """Store a report's new events, at most ``events_per_card`` a card one by one, the rest in its summary.

    Events older than the rules look back are left out (they would be deleted at once). A folded event is
    not stored, so the agent's next report lists it again: one dated at or before its card's summary is
    taken as folded already (an Xid that reaches us late, and older than the summary, is not counted in it).
    ``new``: the node was inserted in this transaction, so nothing of it is stored to read. Returns the rows
    written, summaries included.
    """
    summaries: dict[int, CardHealthEvent] = {}
    stored: dict[int, int] = {}
    if not new:
        mine = CardHealthEvent.objects.filter(node=node, at__gte=keep_from)
        summaries = {e.gpu_index: e for e in mine.filter(what__startswith=SUMMARY)}
        counted = mine.exclude(what__startswith=SUMMARY).values_list("gpu_index").annotate(n=Count("id"))
        stored = dict(counted)
    fresh = [
        e for e in events if e.at >= keep_from and (e.gpu_index not in summaries or e.at > summaries[e.gpu_index].at)
    ]
    kept, folded = A.over_cap([_event_of(e) for e in fresh], stored, config.events_per_card)
    rows = [fresh[i] for i in kept]
    insert_rows(CardHealthEvent, rows)
    for gpu, positions in folded.items():
        rows.append(_fold(node, summaries.get(gpu), [fresh[i] for i in positions], config))
    return rows


def _fold(node: Node, summary: CardHealthEvent | None, events: list[CardHealthEvent], config: A.Settings):
    """The card's summary row, written with ``events`` counted in: as grave as the gravest, dated as the latest."""
    gravest = max(events, key=lambda e: (e.severity, e.at))
    count, words, severity = len(events), gravest.what, gravest.severity
    if summary is not None and (found := _SUMMARY.match(summary.what)):
        count += int(found.group(1))
        if summary.severity >= severity:
            words, severity = found.group(2), summary.severity
    look_back = max(config.window_s, config.clean_s)
    what = (
        f"{SUMMARY}{count} more problems of this card were not recorded one by one (at most "
        f"{config.events_per_card} are kept a card within {look_back:.0f} s); the gravest: {words}"
    )[:WHAT_CHARS]
    row = summary or CardHealthEvent(node=node, gpu_index=events[0].gpu_index, xid=None)
    row.what, row.severity = what, severity
    row.at = max([e.at for e in events] + ([summary.at] if summary is not None else []))
    row.save()
    return row


def _keep_from(now: datetime, config: A.Settings) -> datetime:
    """Events before this are older than the rules look back."""
    return now - timedelta(seconds=max(config.window_s, config.clean_s))


def _event_of(row: CardHealthEvent) -> A.Event:
    severity = H.Severity(min(row.severity, H.Severity.SERVICE))
    return A.Event(at=row.at, gpu=row.gpu_index, severity=severity, what=row.what)


def _showing(cards: Iterable[Any]) -> dict[int, H.Severity | None]:
    """Each card's gravest card-local problem in the report (None: none)."""
    return {
        c["index"]: H.worst([p for p in H.card_problems(c) if A.card_local(p)])
        for c in cards
        if isinstance(c, Mapping) and "index" in c
    }


def _apply(node: Node, decision: A.Decision, holds: Mapping[int, CardHold], now: datetime) -> None:
    for gpu, reason in decision.hold.items():
        CardHold.objects.create(node=node, gpu_index=gpu, since=now, reason=reason)
        AuditEntry.record(ACTOR, "hold-card", f"{node.name} gpu {gpu}", {"reason": reason})
    for gpu in decision.release:
        held = holds[gpu]
        held.delete()
        detail = {"held_since": held.since.isoformat(), "reason": held.reason}
        AuditEntry.record(ACTOR, "release-card", f"{node.name} gpu {gpu}", detail)
    if decision.hold or decision.release:
        name = node.name
        transaction.on_commit(lambda: _send_holds_changed(name))
    if decision.cordon and node.state == NodeState.READY:
        # Only a ready node: a draining one is already being emptied, a cordoned one is the operator's.
        set_node_state(node.name, "cordon", actor=ACTOR, detail={"reason": decision.cordon})
        Node.objects.filter(pk=node.pk).update(health_cordon=decision.cordon)
    if decision.uncordon:
        Node.objects.filter(pk=node.pk).update(health_cordon="")
        set_node_state(node.name, "uncordon", actor=ACTOR, detail={"reason": "clean for the clean window"})


def _send_holds_changed(name: str) -> None:
    """Tell placement (which moves replicas off held cards); a receiver that fails never fails the report."""
    for receiver, result in signals.card_holds_changed.send_robust(sender=Node, name=name):
        if isinstance(result, Exception):
            log.error("%r failed on card_holds_changed(%r)", receiver, name, exc_info=result)
