"""What inventory tells the apps above it, without importing them.

The heartbeat desk (inventory/heartbeats.py) takes in the nodes' liveness. What
the beats also say — the shards' states, the weights deleted — and what their
answers hand out — the shards to run, the weights to delete — belong to
placement and the catalog, which sit above inventory. They connect to these
signals in their AppConfig.ready(); inventory never imports them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from django.dispatch import Signal

heartbeats_flushed = Signal()
"""Sent by each heartbeat flush, once its beats are written, when they said something beyond liveness.

Keyword arguments (``sender`` is :class:`inventory.heartbeats.HeartbeatDesk`):

- ``shard_reports``: ``[(node pk, node name, shard entries)]``, the nodes whose
  shard list differs from the one stored (placement follows them);
- ``came_back``: ``[(node pk, node name)]``, nodes that were unreachable or
  lost and beat again (placement reconciles);
- ``collected``: ``[(node name, {"path": ..., "error": ...})]``, weight
  deletions the agents reported done or refused (the catalog settles them);
- ``at``: the time of the latest beat in the batch.

Sent in the flusher's thread, outside the flush's transaction; a receiver that
raises fails the flush, which the flusher logs (its beats are already written).
"""

heartbeat_answers_wanted = Signal()
"""Sent each time the desk refreshes what heartbeat answers hand out (once per flush).

Each receiver returns a :class:`HeartbeatTables` holding its part; the desk
merges them and answers every beat from that copy until the next refresh, so
answering a beat never queries the database.
"""


@dataclass(frozen=True)
class HeartbeatTables:
    """One higher app's part of the heartbeat answers, keyed the way the desk looks them up."""

    # node pk -> the shards that node should run (placement.assignments)
    shards: dict[int, list[dict]] = field(default_factory=dict)
    # node name -> weight paths that node's agent should delete (catalog.weights)
    collect: dict[str, list[str]] = field(default_factory=dict)
