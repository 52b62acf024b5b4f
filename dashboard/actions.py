"""Cordon, uncordon and drain from the node page.

The words, the audit actions and the placement hook are the API's own
(llmgw.api.views.nodes), so the page and ``POST /api/v1/nodes/{id}/state`` mean
the same thing and leave the same trace. The API keeps its transaction inside
its view; this is that transaction as a function, which the API could call
too (noted for its owner) so that there is one copy.
"""

from __future__ import annotations

from django.db import transaction

from inventory.models import Node
from llmgw.api.views.nodes import ACTIONS, STATES, node_state_changed
from llmgw.core.models import AuditEntry


class NodeStateError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


def set_node_state(name: str, word: str, *, actor: str, via: str = "console") -> tuple[str, str]:
    """Set a node's state from an operator's word (cordon, uncordon, drain); returns (previous, new).

    Written to the audit log even when nothing changed: an operator who
    pressed "drain" on a draining node still did it, and the log says so.
    """
    key = (word or "").strip().lower()
    if key not in STATES:
        raise NodeStateError(400, f"state must be one of cordon, uncordon or drain (got {word!r})")
    state = STATES[key]
    with transaction.atomic():
        node = Node.objects.select_for_update().filter(name=name).first()
        if node is None:
            raise NodeStateError(404, f"no node named {name!r}")
        previous = node.state
        if previous != state:
            Node.objects.filter(pk=node.pk).update(state=state)
        AuditEntry.objects.create(
            actor=actor[:200],
            action=ACTIONS[state],
            target=name[:200],
            detail={"previous": previous, "state": state, "via": via, "user": actor},
        )
    node_state_changed(name)
    return previous, state
