"""A fabric's master subnet manager over time: its changes grouped into events, and flapping."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime, timedelta

from inventory.fabrics.facts import (
    SM_EVENT_GAP,
    SM_FLAP_CHANGES,
    SM_FLAP_WINDOW,
    SM_RECENT,
    PhysicalFabric,
    Problem,
    SMChange,
    SMEvent,
)
from inventory.fabrics.words import _aware, _count_times, _duration, _plural, _when
from inventory.ibnetdiscover import normalize_guid

# --- subnet manager history --------------------------------------------------------


def _sm_events(changes: Iterable[SMChange], live_sms: set[str]) -> list[SMEvent]:
    """Fold the per-port changes into events: the same old→new within SM_EVENT_GAP is one event."""
    by_pair: dict[tuple[str | None, str | None], list[SMChange]] = defaultdict(list)
    for c in changes:
        old, new = normalize_guid(c.old), normalize_guid(c.new)
        if old != new:
            by_pair[(old, new)].append(SMChange(c.node, c.hca, c.port, old, new, _aware(c.at)))
    events: list[SMEvent] = []
    for (old, new), items in by_pair.items():
        # Both ends being the SM of a fabric that is live now means the ports
        # moved between fabrics; no SM changed.
        kind = "moved" if old in live_sms and new in live_sms else "changed"
        items.sort(key=lambda c: c.at)
        current: SMEvent | None = None
        seen: set[tuple[str, str, int]] = set()
        for c in items:
            if current is None or c.at - current.last_at > SM_EVENT_GAP:
                current = SMEvent(c.at, old, new, kind, 0, [], c.at)
                seen = set()
                events.append(current)
            current.last_at = c.at
            if (c.node, c.hca, c.port) not in seen:
                seen.add((c.node, c.hca, c.port))
                current.ports += 1
            if c.node not in current.nodes:
                current.nodes.append(c.node)
    events.sort(key=lambda e: (e.at, e.old or "", e.new or ""))
    return events


def _sm_problems(ph: PhysicalFabric, now: datetime) -> list[Problem]:
    changes = [e for e in ph.sms if e.kind == "changed"]
    window = [e for e in changes if timedelta(0) <= now - e.at <= SM_FLAP_WINDOW]
    recent = [e for e in changes if timedelta(0) <= now - e.at <= SM_RECENT]
    if len(window) >= SM_FLAP_CHANGES:
        times = "; ".join(_event_words(e) for e in window)
        return [
            Problem(
                "sm_flapping",
                f"The master subnet manager of {ph.label} changed {len(window)} times in the last "
                f"{_duration(SM_FLAP_WINDOW)} ({times}): it is flapping. Check the SM hosts (opensm or UFM logs, "
                "their links and priorities) before placing multi-node replicas on it.",
                physical=ph.key,
                fabric=ph.declared[0] if len(ph.declared) == 1 else None,
            )
        ]
    if recent:
        e = recent[-1]
        return [
            Problem(
                "sm_flapping",
                f"The master subnet manager of {ph.label} changed {_count_times(len(recent))} in the last "
                f"{_duration(SM_RECENT)}, last {_event_words(e)}: a failover; if it happens again within "
                f"{_duration(SM_FLAP_WINDOW)} the SM is flapping.",
                physical=ph.key,
                fabric=ph.declared[0] if len(ph.declared) == 1 else None,
            )
        ]
    return []


def _event_words(e: SMEvent) -> str:
    return f"at {_when(e.at)} from {e.old or 'none'} to {e.new or 'none'}, seen by {_plural(e.ports, 'port')}"
