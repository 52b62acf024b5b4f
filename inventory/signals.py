"""What inventory tells the apps above it, without importing them.

Inventory sits low in the layers, so it cannot call placement, the catalog or
the console; it sends one of these instead, and the app that cares connects to
it in its AppConfig.ready(). Two kinds:

- the heartbeat desk's (inventory/writes/heartbeats.py): what the beats say beyond
  liveness (shards' states, weights deleted) and what their answers hand out
  (shards to run, weights to delete) belong to placement and the catalog;
- changes the console's live pages show (``dashboard.receivers``): nodes
  registered, reported, back, gone quiet. The agent API, beside the console
  in the layers, sends these too where it drives inventory's writes;
- an operator's change of a node's state (cordon, drain), which placement
  reconciles after.

Each change is sent once it is committed (``transaction.on_commit`` where the
sender is inside a transaction), so a receiver never hears of a row that was
rolled back. A live-page receiver must not fail its sender: these are sent
from the heartbeat path and from periodic tasks. Every one of those is sent
with ``sender=Node``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from django.dispatch import Signal

# --- the heartbeat desk's ---

heartbeats_flushed = Signal()
"""Sent by each heartbeat flush, once its beats are written, when they said something beyond liveness.

Keyword arguments (``sender`` is :class:`inventory.writes.heartbeats.HeartbeatDesk`):

- ``shard_reports``: ``[(node pk, node name, shard entries)]``, the nodes whose
  shard list differs from the one stored (placement follows them);
- ``came_back``: ``[(node pk, node name)]``, nodes that were unreachable or
  lost and beat again (placement reconciles);
- ``collected``: ``[(node name, {"path": ..., "error": ...})]``, weight
  deletions the agents reported done or refused (the catalog settles them);
- ``prefetched``: ``[(node name, {"model", "source", "state", "bytes_done", ...})]``,
  the agents' progress on the prefetches they were handed (the catalog stores it);
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
    # node name -> [{"model", "source"}] whose weights that node's agent should fetch (catalog.prefetch)
    prefetch: dict[str, list[dict]] = field(default_factory=dict)


# --- changes the live pages show ---

# A node registered for the first time. ``node``: the Node.
node_registered = Signal()

# A full report changed what is stored about a node (sent only when ``result.changed``).
# ``node``: the Node; ``result``: the inventory.writes.ingest.IngestResult.
node_reported = Signal()

# Nodes that had been unreachable were heard from again. ``nodes``: a list of (pk, name), maybe empty.
nodes_came_back = Signal()

# The reachability sweep marked nodes unreachable or lost, or NVLink domains dark or back
# (sent only when ``result.changed``). ``result``: the inventory.reachability.SweepResult.
reachability_changed = Signal()


# --- node state (cordon, uncordon, drain) -----------------------------------------------
# Connected by placement, which reconciles soon.

# An operator set a node's state (inventory.writes.states.set_node_state); sent after it is stored.
# Arguments: ``name``, the node's name.
node_state_changed = Signal()

# Card health held or released cards of a node (inventory.writes.health); sent after it is stored.
# Arguments: ``name``, the node's name. Placement moves replicas off held cards.
card_holds_changed = Signal()
