"""How the fabric analysis words its findings: lists of nodes, plurals, times."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta


def _nodes_list(nodes: Iterable[str], limit: int = 6) -> str:
    ordered = sorted(nodes)
    shown = ", ".join(ordered[:limit])
    return shown + (f" and {len(ordered) - limit} more" if len(ordered) > limit else "")


def _count_nodes(nodes: set[str]) -> str:
    return next(iter(nodes)) if len(nodes) == 1 else f"{len(nodes)} nodes"


def _and_list(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _count_word(n: int) -> str:
    return {2: "two", 3: "three", 4: "four"}.get(n, str(n))


def _aware(at: datetime) -> datetime:
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


def _when(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _count_times(n: int) -> str:
    return "once" if n == 1 else f"{n} times"


def _duration(d: timedelta) -> str:
    hours = d.total_seconds() / 3600
    return "hour" if hours == 1 else f"{hours:g} hours"
