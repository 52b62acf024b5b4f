"""Cordon, uncordon and drain: one operation, shared by the API, the console and anything else.

Written to the audit log even when nothing changed: an operator who pressed
"drain" on a draining node still did it, and the log says so. Placement is
told (through ``inventory.signals``) at once rather than at its next tick: an
operator draining a node is usually about to do something to it.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import transaction

from core.models import AuditEntry
from inventory import signals
from inventory.models import Node, NodeState

log = logging.getLogger(__name__)

# What each word an operator may send means; the verbs are what ctl sends, the states what the API shows.
STATES = {
    "cordon": NodeState.CORDONED,
    "cordoned": NodeState.CORDONED,
    "uncordon": NodeState.READY,
    "ready": NodeState.READY,
    "drain": NodeState.DRAINING,
    "draining": NodeState.DRAINING,
}
ACTIONS = {NodeState.READY: "uncordon", NodeState.CORDONED: "cordon", NodeState.DRAINING: "drain"}


class NodeStateError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


def set_node_state(name: str, word: Any, *, actor: str, detail: dict | None = None) -> tuple[str, str]:
    """Set a node's state from an operator's word (cordon, uncordon, drain); returns (previous, new)."""
    key = word.strip().lower() if isinstance(word, str) else None
    if key not in STATES:
        raise NodeStateError(400, f"state must be one of cordon, uncordon or drain (got {word!r})")
    state = STATES[key]
    with transaction.atomic():
        node = Node.objects.select_for_update().filter(name=name).first()
        if node is None:
            raise NodeStateError(404, f"no node named {name!r}; `llmgw ctl nodes` lists them")
        previous = node.state
        if previous != state:
            Node.objects.filter(pk=node.pk).update(state=state)
        AuditEntry.record(actor, ACTIONS[state], name, {"previous": previous, "state": state, **(detail or {})})
    node_state_changed(name)
    return previous, state


def node_state_changed(name: str) -> None:
    """Say a node's state changed (placement listens); a receiver that fails never fails the change."""
    for receiver, result in signals.node_state_changed.send_robust(sender=Node, name=name):
        if isinstance(result, Exception):
            log.error("%r failed on node_state_changed(%r)", receiver, name, exc_info=result)
