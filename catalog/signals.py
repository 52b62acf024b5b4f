"""What the catalog tells the apps above it, which it never imports.

An app that cares connects a receiver in its ``AppConfig.ready()`` (placement
does, to reconcile soon). Receivers get the arguments named beside each signal.
"""

from __future__ import annotations

from django.dispatch import Signal

# A model was added, redefined, removed, scaled or unparked; sent once the change is committed.
# Arguments: ``name``, the model's name.
model_changed = Signal()
