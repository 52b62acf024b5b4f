"""Ports slower than their fabric, and error counters rising since the previous report."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from inventory.fabrics.facts import (
    _ADVICE_CONGESTION,
    _ADVICE_CONSTRAINT,
    _ADVICE_PHYSICAL,
    _CONGESTION,
    _PERFQUERY_NAMES,
    _PHYSICAL,
    ERROR_COUNTERS,
    PhysicalFabric,
    Problem,
    _Port,
    _who,
)
from inventory.fabrics.words import _plural

# --- rates and counters ----------------------------------------------------------


def _slow_ports(ph: PhysicalFabric, members: list[_Port]) -> list[Problem]:
    common = ph.rate_gbps
    if common is None:
        return []
    peers = sum(1 for m in members if m.facts.rate_gbps == common)
    out = []
    for m in members:
        rate = m.facts.rate_gbps
        if rate is not None and rate < common:
            out.append(
                Problem(
                    "slow_port",
                    f"{_who(m)} runs at {rate:g} Gb/s where {_plural(peers, 'port')} on {ph.label} run at "
                    f"{common:g} Gb/s: the link trained at a lower width or speed; "
                    "reseat or replace its cable or transceiver.",
                    fabric=m.declared,
                    physical=ph.key,
                    node=m.ref.node,
                    hca=m.ref.hca,
                    port=m.ref.port,
                )
            )
    return out


def _canonical_counters(counters: Mapping[str, Any] | None) -> dict[str, int] | None:
    """Counters under their sysfs names, as integers; None when not reported. Unreadable values are left out."""
    if counters is None:
        return None
    out: dict[str, int] = {}
    for name, value in counters.items():
        key = name if name in ERROR_COUNTERS else _PERFQUERY_NAMES.get(str(name).lower())
        if key is None:
            continue
        try:
            number = int(value)
        except (TypeError, ValueError, OverflowError):
            continue
        if number >= 0:
            out[key] = number
    return out


def _errors_rising(ports: list[_Port], known: set[str]) -> list[Problem]:
    out = []
    for p in ports:
        now, before = _canonical_counters(p.facts.counters), _canonical_counters(p.facts.previous_counters)
        if now is None or before is None:
            continue  # nothing to compare: a first report is not a rise
        rises = _rises(now, before)
        if rises:
            out.append(
                Problem(
                    "errors_rising",
                    _rising_message(p, rises),
                    fabric=p.declared,
                    # A port that is down joins no physical fabric, so it names none.
                    physical=p.key if p.key in known else None,
                    node=p.ref.node,
                    hca=p.ref.hca,
                    port=p.ref.port,
                )
            )
    return out


def _rises(now: dict[str, int], before: dict[str, int]) -> list[tuple[str, int, bool]]:
    """(counter, rise, was reset) for each error counter that rose; in ERROR_COUNTERS order."""
    out = []
    for name in ERROR_COUNTERS:
        if name not in now or name not in before:
            continue
        if now[name] > before[name]:
            out.append((name, now[name] - before[name], False))
        elif now[name] < before[name] and now[name] > 0:
            # Reset (driver reload, perfquery -R) and counting again: at least
            # this many happened since.
            out.append((name, now[name], True))
    return out


def _rising_message(p: _Port, rises: list[tuple[str, int, bool]]) -> str:
    parts = [
        f"{ERROR_COUNTERS[n]} +{d}" + (" (at least; the counter was reset)" if reset else "") for n, d, reset in rises
    ]
    names = {n for n, _, _ in rises}
    if names & _PHYSICAL:
        advice = _ADVICE_PHYSICAL
    elif names & _CONGESTION:
        advice = _ADVICE_CONGESTION
    else:
        advice = _ADVICE_CONSTRAINT
    return f"{_who(p)}: {', '.join(parts)} since the previous report; {advice}."
