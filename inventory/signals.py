"""What the inventory tells the apps above it, which it never imports.

An app that cares connects a receiver in its ``AppConfig.ready()``. Receivers
get the arguments named beside each signal.
"""

from __future__ import annotations

from django.dispatch import Signal

# --- node state (cordon, uncordon, drain) -----------------------------------------------
# Connected by placement, which reconciles soon.

# An operator set a node's state (inventory.states.set_node_state); sent after it is stored.
# Arguments: ``name``, the node's name.
node_state_changed = Signal()
