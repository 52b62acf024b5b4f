"""The console's ears: the lower apps' signals, each turned into one message to the pages (dashboard.messages).

Connected in DashboardConfig.ready(). The senders have already waited for
their transactions to commit, so these publish at once. None of them raises:
a signal's ``send`` passes a receiver's exception on to its sender, and the
senders are the heartbeat flusher's thread, the agent's requests and the
periodic tasks, none of which a page that cannot be told should stop.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from dashboard import live, messages
from inventory import signals as inventory_signals
from inventory.models import Node
from inventory.reachability import SweepResult
from inventory.writes.ingest import IngestResult
from observability import signals as observability_signals
from observability.sweeps import Recorded
from placement import outgoing as placement_outgoing
from placement.writes.reconciler import Result

log = logging.getLogger(__name__)


def never_fails(receiver: Callable[..., None]) -> Callable[..., None]:
    """Log what a receiver raised instead of passing it to the sender; the page catches up at its next load."""

    @functools.wraps(receiver)
    def wrapped(*args: Any, **kwargs: Any) -> None:
        try:
            receiver(*args, **kwargs)
        except Exception:
            log.exception("%s failed; the live pages miss this change until they reload", receiver.__name__)

    return wrapped


@never_fails
def on_node_registered(sender: Any, node: Node, **_kw: Any) -> None:
    live.publish([live.fleet_group()], messages.node_registered(node))


@never_fails
def on_node_reported(sender: Any, node: Node, result: IngestResult, **_kw: Any) -> None:
    live.publish([live.fleet_group()], messages.node_report(node, result))


@never_fails
def on_nodes_came_back(sender: Any, nodes: list[tuple[int, str]], **_kw: Any) -> None:
    # In one go: a flush that finds 300 nodes back is one round of sends, not 300 (dashboard.live.publish_many).
    live.publish_many([([live.fleet_group()], messages.node_reachable(pk, name)) for pk, name in nodes])


@never_fails
def on_reachability_changed(sender: Any, result: SweepResult, **_kw: Any) -> None:
    live.publish([live.fleet_group()], messages.fleet_reachability(result))


@never_fails
def on_findings_changed(sender: Any, result: Recorded, **_kw: Any) -> None:
    live.publish([live.fleet_group()], messages.fleet_findings(result))


@never_fails
def on_placement_changed(sender: Any, result: Result, **_kw: Any) -> None:
    live.publish([live.fleet_group()], messages.placement_changed(result))


CONNECTIONS = [
    (inventory_signals.node_registered, on_node_registered),
    (inventory_signals.node_reported, on_node_reported),
    (inventory_signals.nodes_came_back, on_nodes_came_back),
    (inventory_signals.reachability_changed, on_reachability_changed),
    (observability_signals.findings_changed, on_findings_changed),
    (placement_outgoing.placement_changed, on_placement_changed),
]


def connect() -> None:
    """Connect every receiver once (a dispatch_uid each, so a second ready() adds nothing)."""
    for signal, receiver in CONNECTIONS:
        signal.connect(receiver, dispatch_uid=f"dashboard.receivers.{receiver.__name__}")
