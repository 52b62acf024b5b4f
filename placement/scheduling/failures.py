"""How fast replicas are moved off lost nodes: at most N a minute, fleet-wide, oldest loss first.

Pure: times in, replica ids out. The reconciler passes the moves it made in
the last minute (kept in the database, ``placement.models.NodeLossMove``, so
every control host sees the same count) and the replicas waiting to move;
this says which may move now. Like Kubernetes' node eviction rate: a rack
switch that drops forty machines must not start forty hundred-gigabyte
downloads at once.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

MOVES_PER_MINUTE = 20
MINUTE = timedelta(seconds=60)


@dataclass(frozen=True, slots=True)
class Waiting:
    """A replica with a shard on a lost node: ``lost_at`` is when the earliest of its nodes went silent."""

    replica_id: str
    lost_at: datetime


def room_now(recent: Iterable[datetime], now: datetime, per_minute: int) -> int:
    """How many moves may be made at ``now`` without more than ``per_minute`` in any 60 s window.

    Only moves in the minute before ``now`` can share a window with one made
    now; the moves are made at ``now``, so the window ending at ``now`` is
    the one that binds.
    """
    inside = sum(1 for t in recent if now - MINUTE < t <= now)
    return max(0, per_minute - inside)


def admit(waiting: Sequence[Waiting], recent: Iterable[datetime], now: datetime, per_minute: int) -> list[str]:
    """The replicas to move now: the oldest losses first (then by id), as many as the rate leaves room for."""
    order = sorted(waiting, key=lambda w: (w.lost_at, w.replica_id))
    return [w.replica_id for w in order[: room_now(recent, now, per_minute)]]
