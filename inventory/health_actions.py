"""What llmgw does about a node's card health problems: hold a card, cordon a node, undo either.

Pure: the node's recent problem events, what is held now, the time and the settings in; the
actions out. No Django, no I/O. inventory.writes.health applies the actions (the audit rows,
the states); observability's sweep turns what is held into findings.

The rules, each with its reason:

* Only problems of WARNING severity and above count (:func:`counts`): an INFO fact or an
  APPLICATION fault (the catalogue's IGNORE and RESTART_APP) says nothing against the card.
* A card with a FATAL (or SERVICE) problem is *held*: out of placement, and a replica on it is
  moved elsewhere, replacement first (placement reads the hold). Reason: the catalogue says the
  card cannot serve until it is reset.
* ``cordon_after`` counted problems on one node within ``window_s`` cordon the node, with the
  problems as the reason. Reason: a node whose cards keep failing is suspect as a whole (power,
  cooling, a riser), even when each problem alone is only a warning.
* Fabric problems (NVLink fabric registration, health mask bits) do not act here: they are
  usually shared by a tray or a rack (a fabric manager restart, an NVSwitch tray) and are
  handled as one NVLink domain event; holding each card would move every replica of the rack
  at once, the storm this is meant to prevent. They still keep the card out of new placement.
* At most ``events_per_card`` events of one card are kept one by one within the look-back
  (:func:`over_cap`); the rest are folded into one summary event of that card, as grave as the
  gravest it folds. Reason: a report lists up to 32 new Xids a card, and a node (a broken card,
  or a hostile agent) sending report after report would otherwise write rows without end (100
  reports wrote 25,600); a card with that many problems is held or its node cordoned long before,
  and the summary keeps the gravest, so no decision below changes.
* Hysteresis: a hold or a health cordon is lifted only once the card (or the node) has been
  clean — no counted problem, no fatal problem still showing — for ``clean_s``. Reason: a card
  that recovers by itself often fails again; putting it back at once would move replicas to it
  and off it again.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from inventory.health_rules import Kind, Problem, Severity, is_fatal

WINDOW_S_DEFAULT = 600.0
CORDON_AFTER_DEFAULT = 3
CLEAN_S_DEFAULT = 3600.0
EVENTS_PER_CARD_DEFAULT = 64


@dataclass(frozen=True)
class Settings:
    """How the rules act: the counting window, how many problems cordon, how long clean undoes."""

    window_s: float = WINDOW_S_DEFAULT
    cordon_after: int = CORDON_AFTER_DEFAULT
    clean_s: float = CLEAN_S_DEFAULT
    events_per_card: int = EVENTS_PER_CARD_DEFAULT


@dataclass(frozen=True)
class Event:
    """One problem seen on one card of the node: when, which card, how grave, in words."""

    at: datetime
    gpu: int
    severity: Severity
    what: str


@dataclass(frozen=True)
class Decision:
    """What to do now. Cards are indices; ``cordon`` is the reason, None to leave the node as it is."""

    hold: dict[int, str] = field(default_factory=dict)
    release: tuple[int, ...] = ()
    cordon: str | None = None
    uncordon: bool = False

    @property
    def acts(self) -> bool:
        return bool(self.hold or self.release or self.cordon or self.uncordon)


FABRIC_KINDS = frozenset(k for k in Kind if k.name.startswith("FABRIC_"))


def card_local(problem: Problem) -> bool:
    """Whether a problem is the card's own, one these rules act on (not a fabric problem; see above)."""
    return problem.kind not in FABRIC_KINDS


def counts(severity: Severity) -> bool:
    """Whether a problem of this severity counts against the card and the node (WARNING and above)."""
    return severity >= Severity.WARNING


def _clean_since(events: Iterable[Event], now: datetime, clean_s: float) -> bool:
    """No counted event within the last ``clean_s`` (an event dated in the future counts as now)."""
    start = now - timedelta(seconds=clean_s)
    return not any(counts(e.severity) and e.at > start for e in events)


def over_cap(new: Sequence[Event], stored: Mapping[int, int], cap: int) -> tuple[list[int], dict[int, list[int]]]:
    """A report's new events split: those kept one by one, and per card those folded into its summary event.

    Positions in ``new`` are returned. ``stored``: each card's events kept one by one within the look-back
    already (a card not named: none). A card keeps at most ``cap`` one by one; its graver events first, so
    a fatal one is folded only once the card is full, and the summary then carries it.
    """
    room = {gpu: max(0, cap - stored.get(gpu, 0)) for gpu in {e.gpu for e in new}}
    kept: list[int] = []
    folded: dict[int, list[int]] = {}
    for i in sorted(range(len(new)), key=lambda i: (-new[i].severity, new[i].at, i)):
        gpu = new[i].gpu
        if room[gpu] > 0:
            room[gpu] -= 1
            kept.append(i)
        else:
            folded.setdefault(gpu, []).append(i)
    return sorted(kept), folded


def decide(
    events: Sequence[Event],
    showing: Mapping[int, Severity | None],
    held: Iterable[int],
    health_cordoned: bool,
    now: datetime,
    settings: Settings,
) -> Decision:
    """The actions for one node.

    ``events``: the node's problem events (older ones than ``max(window_s, clean_s)`` may be
    left out); ``showing``: each card's gravest problem in its latest report (None: none);
    ``held``: the cards held now; ``health_cordoned``: whether the node is cordoned by these
    rules (an operator's cordon is the operator's to lift).
    """
    held = set(held)
    by_card: dict[int, list[Event]] = {}
    for e in events:
        by_card.setdefault(e.gpu, []).append(e)
    hold: dict[int, str] = {}
    for gpu in sorted(set(showing) | set(by_card)):
        if gpu in held:
            continue
        worst_now = showing.get(gpu)
        if worst_now is not None and is_fatal(worst_now):
            hold[gpu] = _fatal_words(by_card.get(gpu, []), now, settings) or "a fatal problem is showing"
            continue
        why = _fatal_words(by_card.get(gpu, []), now, settings)
        if why:
            hold[gpu] = why
    release = tuple(
        sorted(
            gpu
            for gpu in held
            if not is_fatal(showing.get(gpu) or Severity.INFO)
            and _clean_since(by_card.get(gpu, []), now, settings.clean_s)
        )
    )
    window_start = now - timedelta(seconds=settings.window_s)
    recent = sorted((e for e in events if counts(e.severity) and e.at > window_start), key=lambda e: (e.at, e.gpu))
    cordon = None
    if not health_cordoned and len(recent) >= max(1, settings.cordon_after):
        shown = "; ".join(f"gpu {e.gpu}: {e.what}" for e in recent[-5:])
        cordon = f"{len(recent)} card health problems within {settings.window_s:.0f} s ({shown})"
    fatal_showing = any(s is not None and is_fatal(s) for s in showing.values())
    uncordon = health_cordoned and not fatal_showing and _clean_since(events, now, settings.clean_s)
    return Decision(hold=hold, release=release, cordon=cordon, uncordon=uncordon)


def _fatal_words(events: list[Event], now: datetime, settings: Settings) -> str:
    """The latest fatal event within the clean window, in words; blank when there is none."""
    start = now - timedelta(seconds=settings.clean_s)
    fatal = [e for e in events if is_fatal(e.severity) and e.at > start]
    return max(fatal, key=lambda e: e.at).what if fatal else ""
