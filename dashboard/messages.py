"""Every kind of message the console's pages hear, declared once: its name and the shape of its data.

A message on the wire is ``{"kind", "subject", "data"}`` (dashboard.live
sends it, dashboard.consumers forwards it, static/dashboard/live.js reads
it). The pages read ``kind`` in two ways, so keep them when adding one: a
kind starting ``node.`` is about the node named in ``subject``, and
``node.registered`` means a node the page has not drawn; the reachability
sweep's ``unreachable``/``lost`` lists and ``domains_dark``/``domains_back``,
and a report's ``domain_moves``, are read wherever they appear.

Each builder turns what a lower app signalled (dashboard.receivers) into one
message; none reads the database, so publishing costs no query.
"""

from __future__ import annotations

from typing import TypedDict

from dashboard.live import BATCH, RESYNC, Update
from inventory.models import Node
from inventory.reachability import SweepResult
from inventory.writes.ingest import IngestResult
from observability.sweeps import Recorded
from placement.writes.reconciler import Result

NODE_REPORT = "node.report"
NODE_REGISTERED = "node.registered"
NODE_REACHABLE = "node.reachable"
FLEET_REACHABILITY = "fleet.reachability"
FLEET_FINDINGS = "fleet.findings"
PLACEMENT_CHANGED = "placement.changed"
FLEET_SUBJECT = "fleet"


class NodeReport(TypedDict):
    """``node.report`` (subject: the node's name): what a full report changed."""

    node: int
    fields: list[str]
    gpus_added: list[int]
    gpus_updated: list[int]
    gpus_removed: list[int]
    ports: list[str]
    # (gpu index, the domain key it left or None, the one it joined or None)
    domain_moves: list[tuple[int, str | None, str | None]]


class NodeRef(TypedDict):
    """``node.registered`` and ``node.reachable`` (subject: the node's name): which node."""

    node: int


class FleetReachability(TypedDict):
    """``fleet.reachability`` (subject: fleet): nodes by name, NVLink domains by pk (as strings)."""

    unreachable: list[str]
    lost: list[str]
    domains_dark: list[str]
    domains_back: list[str]


class FleetFindings(TypedDict):
    """``fleet.findings`` (subject: fleet): the doctor's findings opened and resolved, as [kind, subject]."""

    opened: list[list[str]]
    resolved: list[list[str]]


class PlacementChanged(TypedDict):
    """``placement.changed`` (subject: fleet): how many replicas (or models, for parked) a reconcile touched."""

    created: int
    replacing: int
    stopped: int
    lost: int
    reaped: int
    parked: int
    timed_out: int
    """Replicas failed for not being ready by their start deadline (placement.scheduling.startdeadline)."""
    stale: int
    explained: int
    scaled: int
    """Models whose desired count the autoscaler changed."""
    waiting: int  # replicas on lost nodes left for a later pass by the move rate
    vanished: int
    """Writes undone because a row they pointed at was deleted under the pass (core.vanished)."""


class Batch(TypedDict):
    """``batch`` (subject: fleet): messages held back for a moment, in the order they came.

    A publishing process sends one per window to the layer (dashboard.live),
    and a page's socket one per frame, of the updates it wants
    (dashboard.consumers); the page reads each of ``updates`` as if it had
    come alone. Batches are never nested.
    """

    updates: list[Update]


class Resync(TypedDict):
    """``resync`` (subject: fleet): too many messages came at once to list; the page fetches every part again."""

    held: int


def batch(updates: list[Update]) -> Update:
    return Update(kind=BATCH, subject=FLEET_SUBJECT, data=Batch(updates=updates))


def resync(held: int) -> Update:
    return Update(kind=RESYNC, subject=FLEET_SUBJECT, data=Resync(held=held))


def node_report(node: Node, result: IngestResult) -> Update:
    data = NodeReport(
        node=node.pk,
        fields=result.node_fields,
        gpus_added=result.gpus_added,
        gpus_updated=result.gpus_updated,
        gpus_removed=result.gpus_removed,
        ports=result.ports_changed,
        domain_moves=result.domain_moves,
    )
    return Update(kind=NODE_REPORT, subject=node.name, data=data)


def node_registered(node: Node) -> Update:
    return Update(kind=NODE_REGISTERED, subject=node.name, data=NodeRef(node=node.pk))


def node_reachable(pk: int, name: str) -> Update:
    return Update(kind=NODE_REACHABLE, subject=name, data=NodeRef(node=pk))


def fleet_reachability(result: SweepResult) -> Update:
    data = FleetReachability(
        unreachable=result.unreachable,
        lost=result.lost,
        domains_dark=result.domains_dark,
        domains_back=result.domains_back,
    )
    return Update(kind=FLEET_REACHABILITY, subject=FLEET_SUBJECT, data=data)


def fleet_findings(result: Recorded) -> Update:
    data = FleetFindings(opened=[list(k) for k in result.opened], resolved=[list(k) for k in result.resolved])
    return Update(kind=FLEET_FINDINGS, subject=FLEET_SUBJECT, data=data)


def placement_changed(result: Result) -> Update:
    # Result.summary() counts each of its lists; PlacementChanged names them (a test keeps the two alike).
    data = PlacementChanged(**result.summary())
    return Update(kind=PLACEMENT_CHANGED, subject=FLEET_SUBJECT, data=data)
