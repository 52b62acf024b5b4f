"""Hooks other parts call when something placement depends on changed: a reconcile runs soon.

Soon, not now: the caller is usually inside a transaction (an admin action,
an API call, a heartbeat), so the task is queued once that commits, and the
beat runs one every few seconds anyway. A broker that cannot be reached only delays
placement to the next beat, so it never fails the caller's change.
"""

from __future__ import annotations

import logging

from django.db import transaction

log = logging.getLogger(__name__)


def reconcile_soon(why: str) -> None:
    """Queue a reconcile after the current transaction commits (at once outside one)."""
    transaction.on_commit(lambda: _enqueue(why))


def _enqueue(why: str) -> None:

    from placement.tasks import reconcile

    # The embedded broker too: its messages are written whole (llmgw.core.broker).
    try:
        reconcile.apply_async(expires=30)
    except Exception:
        log.warning("could not queue a reconcile (%s); the next beat runs one", why, exc_info=True)


def catalog_changed(model_name: str) -> None:
    """A model was added, redefined, removed, scaled or unparked."""
    reconcile_soon(f"model {model_name} changed")


def node_state_changed(node_name: str) -> None:
    """A node was cordoned, drained, made ready, or came back."""
    reconcile_soon(f"node {node_name} changed")


def shards_changed(node_name: str) -> None:
    """A shard failed, or a replacement became ready so a drained replica can stop."""
    reconcile_soon(f"shards on {node_name} changed")
