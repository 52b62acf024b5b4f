"""What placement tells the apps above it, without importing them: the console hears a reconcile's changes.

Apart from placement.signals (the hooks that queue a reconcile when what it
depends on changes), so that the reconciler, which sends this, imports
nothing that imports it back.
"""

from __future__ import annotations

from django.dispatch import Signal

# A reconcile changed replicas or explanations, sent once its transaction committed, for the apps above
# (the console's live pages) to hear without placement importing them.
# ``sender``: placement.models.Replica; ``result``: the placement.writes.reconciler.Result.
placement_changed = Signal()
