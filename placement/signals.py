"""Hooks called when something placement depends on changed: a reconcile runs soon.

Placement's own modules call them; the catalog and the inventory, which
never import placement, send their signals (``catalog.signals``,
``inventory.signals``), which the receivers at the end turn into these calls.

Soon, not now: the caller is usually inside a transaction (an admin action,
an API call, a heartbeat), so the task is queued once that commits, and the
beat runs one every few seconds anyway. A broker that cannot be reached only
delays placement to the next beat, so it never fails the caller's change.

Changes that come together ask for one reconcile, not one each: a reconcile
reads the whole state, so one queued after the last of them sees them all. A
process queues at most one every ``COALESCE_S``; a change inside that window
is covered by one more, queued when the window ends. (A heartbeat flush that
found 300 nodes back had queued 300 reconciles, one per node, and spent most
of its time doing so.)

The other direction, what placement tells the apps above, is placement.outgoing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from django.db import transaction

from core import outage
from placement.tasks import reconcile

log = logging.getLogger(__name__)
COALESCE_S = 0.5


class _Coalescer:
    """Queues the reconcile task at most once per window, with one more at the window's end if asked meanwhile."""

    def __init__(self, window_s: float, send: Callable[[str], None] | None = None) -> None:
        self.window_s = window_s
        # What queues the task; given, it lets a test watch this coalescer alone (a trailing timer
        # left by another one, the process's own, must not count as this one's).
        self.send = send or _send
        self.lock = threading.Lock()
        self.last = -window_s
        self.trailing: threading.Timer | None = None

    def ask(self, why: str) -> None:
        with self.lock:
            wait = self.last + self.window_s - time.monotonic()
            if wait <= 0 and self.trailing is None:
                self.last = time.monotonic()
                now = True
            else:
                now = False
                if self.trailing is None:
                    self.trailing = threading.Timer(max(wait, 0.0), self._window_ended)
                    self.trailing.daemon = True
                    self.trailing.start()
        if now:
            self.send(why)

    def _window_ended(self) -> None:
        with self.lock:
            self.trailing = None
            self.last = time.monotonic()
        self.send("changes made while the last reconcile was being queued")


def _send(why: str) -> None:
    # The embedded broker too: its messages are written whole (llmgw.broker).
    # While the broker is known to be down, one try rather than kombu's retries: the caller is a request
    # or a flush, and the beat runs a reconcile once the broker is back.
    try:
        reconcile.apply_async(expires=30, retry=not outage.redis.down)
    except Exception as exc:  # noqa: BLE001 - said once per outage (core.outage), the change is kept
        outage.redis.failed(exc)


_coalescer = _Coalescer(COALESCE_S)


def reconcile_soon(why: str) -> None:
    """Queue a reconcile after the current transaction commits (at once outside one)."""
    transaction.on_commit(lambda: _coalescer.ask(why))


def catalog_changed(model_name: str) -> None:
    """A model was added, redefined, removed, scaled or unparked."""
    reconcile_soon(f"model {model_name} changed")


def node_state_changed(node_name: str) -> None:
    """A node was cordoned, drained, made ready, or came back."""
    reconcile_soon(f"node {node_name} changed")


def shards_changed(node_name: str) -> None:
    """A shard failed, or a replacement became ready so a drained replica can stop."""
    reconcile_soon(f"shards on {node_name} changed")


# --- receivers of the lower apps' signals, connected in PlacementConfig.ready() ------------


def on_model_changed(sender: object, *, name: str, **kwargs: object) -> None:
    """catalog.signals.model_changed."""
    catalog_changed(name)


def on_node_state_changed(sender: object, *, name: str, **kwargs: object) -> None:
    """inventory.signals.node_state_changed."""
    node_state_changed(name)
