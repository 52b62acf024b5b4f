"""What inventory tells the apps above it, without importing them: nodes registered, reported, back, gone quiet.

Inventory sits low in the layers, so it cannot call the console to say that
something changed; it sends one of these instead, and the app that cares (the
console's live pages, ``dashboard.receivers``) connects to it in its
AppConfig.ready(). The agent API, beside the console in the layers, sends them
too where it drives inventory's writes.

Each is sent once the change is committed (``transaction.on_commit`` where
the sender is inside a transaction), so a receiver never hears of a row that
was rolled back. A receiver must not fail its sender: these are sent from
the heartbeat path and from periodic tasks. Every one is sent with
``sender=Node``.
"""

from __future__ import annotations

from django.dispatch import Signal

# A node registered for the first time. ``node``: the Node.
node_registered = Signal()

# A full report changed what is stored about a node (sent only when ``result.changed``).
# ``node``: the Node; ``result``: the inventory.ingest.IngestResult.
node_reported = Signal()

# Nodes that had been unreachable were heard from again. ``nodes``: a list of (pk, name), maybe empty.
nodes_came_back = Signal()

# The reachability sweep marked nodes unreachable or lost, or NVLink domains dark or back
# (sent only when ``result.changed``). ``result``: the inventory.reachability.SweepResult.
reachability_changed = Signal()
