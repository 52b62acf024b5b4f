"""When many nodes falling silent is a partition, and when one node coming and going is a flapper.

Pure: names and times in, decisions out; no Django, no I/O (the purity
contract in pyproject.toml holds it to that). The reachability sweep
(``inventory.reachability``) calls these and records what they decide.

A *group* is a set of nodes that can be cut off together: the whole fleet,
the nodes of one InfiniBand fabric, or the nodes sharing a label value (a
rack). When more than ``share`` of a group's nodes that were reachable at the
start of a window of ``window_s`` seconds went silent inside it, that is a
partition of the group — the network between us and it, not that many
machines dying — and nothing on those nodes is to be moved until it ends.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

# Defaults, with their reasons in docs/operations.md ("Node loss").
PARTITION_SHARE = 0.5
PARTITION_WINDOW_S = 60.0
PARTITION_MIN_NODES = 2
FLAPS_TO_CORDON = 3
FLAP_WINDOW_S = 1800.0
PARTITION_HOLD_S = 300.0


@dataclass(frozen=True, slots=True)
class Partition:
    """A group found partitioned: its name, the nodes that went silent, and when the first of them did."""

    group: str
    nodes: tuple[str, ...]
    members: int
    started_at: datetime


def partitioned(
    members: Iterable[str],
    silent_since: Mapping[str, datetime],
    *,
    share: float = PARTITION_SHARE,
    window_s: float = PARTITION_WINDOW_S,
    min_nodes: int = PARTITION_MIN_NODES,
) -> tuple[str, ...] | None:
    """The nodes of a group that went silent together, if more than ``share`` of it did within one window.

    Every window that starts at a node's silence is tried (a window starting
    anywhere else holds no more silences and at least as many reachable
    nodes); of those that pass, the one holding the most silences, the
    earliest among equals. None when no window passes the share, or when
    fewer than ``min_nodes`` went silent: one machine of a two-machine rack
    dying is a failure, not a partition.

    One pass over the silences in time order, the window's end moving with
    its start: O(n log n) in the group's size. (Counting each window's nodes
    afresh was O(n²): 10,000 nodes silent together cost the sweep a minute.)
    """
    members = set(members)
    window = timedelta(seconds=window_s)
    times = sorted(silent_since[n] for n in members if n in silent_since)
    answering = len(members) - len(times)
    need = max(1, min_nodes)
    best_start: datetime | None = None
    best = 0
    first = end = 0
    while first < len(times):
        start = times[first]
        # ``first`` is the first silence at ``start``: those from here on were reachable at ``start``.
        end = max(end, first)
        while end < len(times) and times[end] <= start + window:
            end += 1
        went, reachable = end - first, answering + len(times) - first
        if went >= need and reachable and went / reachable > share and went > best:
            best_start, best = start, went
        while first < len(times) and times[first] == start:
            first += 1
    if best_start is None:
        return None
    return tuple(
        sorted(n for n in members if n in silent_since and best_start <= silent_since[n] <= best_start + window)
    )


def find_partitions(
    groups: Mapping[str, Iterable[str]],
    silent_since: Mapping[str, datetime],
    *,
    already: Iterable[str] = (),
    share: float = PARTITION_SHARE,
    window_s: float = PARTITION_WINDOW_S,
    min_nodes: int = PARTITION_MIN_NODES,
) -> list[Partition]:
    """Every group newly partitioned, in the order of ``groups`` (the widest first).

    ``already`` names nodes in a partition found before: a group whose silent
    nodes are all among those (or among an earlier group's here) is the same
    event seen from another side, and is not found twice.
    """
    covered = set(already)
    found = []
    for group, members in groups.items():
        members = set(members)
        nodes = partitioned(members, silent_since, share=share, window_s=window_s, min_nodes=min_nodes)
        if nodes is None or set(nodes) <= covered:
            continue
        covered |= set(nodes)
        found.append(Partition(group, nodes, len(members), min(silent_since[n] for n in nodes)))
    return found


def partition_over(nodes: Iterable[str], still_silent: Iterable[str], *, share: float = PARTITION_SHARE) -> bool:
    """A partition ends once no more than ``share`` of the nodes it named are still silent.

    The rest are then failures like any other, moved at the normal rate.
    """
    nodes = set(nodes)
    if not nodes:
        return True
    return len(nodes & set(still_silent)) <= share * len(nodes)


def flaps(downs: Iterable[datetime], now: datetime, *, down_now: bool, window_s: float = FLAP_WINDOW_S) -> int:
    """How many times a node went silent and came back within the window before ``now``.

    ``downs`` are the times it went silent; each down but one still going
    (``down_now``) was followed by a return.
    """
    since = now - timedelta(seconds=window_s)
    count = sum(1 for t in downs if since <= t <= now)
    return max(0, count - (1 if down_now and count else 0))


def should_cordon(flap_count: int, *, flaps_to_cordon: int = FLAPS_TO_CORDON) -> bool:
    """A node that flapped this many times is cordoned; 0 turns the rule off."""
    return flaps_to_cordon > 0 and flap_count >= flaps_to_cordon


def hold_until(started_at: datetime, *, members: int, fleet: int, hold_s: float = PARTITION_HOLD_S) -> datetime | None:
    """When a partition stops holding its nodes and ends as losses; None: it holds until they answer or resume.

    A group cut off for longer than ``hold_s`` is no longer a switch
    rebooting: its nodes are lost and their replicas moved at the normal rate,
    oldest first. A partition of a group that is the whole fleet (``members``
    at least ``fleet``) never does: then it is most likely the control host
    that is cut off, and there is nowhere to move to. ``hold_s`` 0 or less
    turns the bound off. The bound is rounded up to the microsecond a
    datetime holds, never down: ``timedelta`` rounds to the nearest, which
    made a hold of a fraction of a microsecond end at its own start.
    """
    if hold_s <= 0 or members >= fleet:
        return None
    return started_at + timedelta(microseconds=math.ceil(hold_s * 1_000_000))


def held_past(until: datetime | None, now: datetime) -> bool:
    """Whether a partition held until ``until`` (:func:`hold_until`) has turned into losses at ``now``."""
    return until is not None and now >= until


def partition_message(
    group: str, nodes: Iterable[str], members: int, started_at: datetime, until: datetime | None = None
) -> str:
    """The finding's words, one place for the sweep that opens it and the doctor that keeps it.

    ``until`` is when it ends as losses (:func:`hold_until`); None says it holds until answered or resumed.
    """
    nodes = sorted(nodes)
    shown = ", ".join(nodes[:10]) + (f" and {len(nodes) - 10} more" if len(nodes) > 10 else "")
    if until is None:
        end = "nothing on them is moved until they answer again or an operator runs `llmgw ctl resume-moves`"
    else:
        end = (
            "nothing on them is moved until they answer again, an operator runs `llmgw ctl resume-moves`, "
            f"or {until:%Y-%m-%d %H:%M:%S %Z}, when those still silent are lost and their replicas moved at the "
            "normal rate"
        )
    return (
        f"{group}: {len(nodes)} of {members} nodes went silent together at {started_at:%Y-%m-%d %H:%M:%S %Z} "
        f"({shown}). That is a partition, not failures: {end}."
    )


def flapping_reason(returns: int, window_s: float = FLAP_WINDOW_S) -> str | None:
    """Why a node that came back takes no new replica until the cordon rule decides on it; None: it is not flapping.

    From its first return within the window: a node that went and came back
    is the likeliest to go again, and a replica placed on it would be moved a
    second time.
    """
    if returns < 1:
        return None
    return f"flapping: {returns} return{'s' if returns != 1 else ''} in {window_s / 60:.0f} min"
