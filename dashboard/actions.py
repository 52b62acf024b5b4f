"""Cordon, uncordon and drain from the node page: the same operation as the API's (inventory.writes.states)."""

from __future__ import annotations

from inventory.writes.states import NodeStateError, set_node_state

__all__ = ["NodeStateError", "set_node_state_from_console"]


def set_node_state_from_console(name: str, word: str, *, actor: str) -> tuple[str, str]:
    return set_node_state(name, word, actor=actor, detail={"via": "console", "user": actor})
