"""Which nodes went silent and came back within the flap window, and how often.

One reading for the three that act on it: the reachability sweep (which
cordons a node at ``LLMGW_FLAPS_TO_CORDON``), placement's snapshot (which
keeps new replicas off a flapping node from its first return until then) and
the doctor's sweep (a ``node_flapping`` finding). Silences a partition
explains are not the node's doing and do not count; nor do those before the
node was last cordoned for flapping, so an operator who uncordons it starts
its count again.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta

from inventory import failure_rules
from inventory.models import FleetEvent


@dataclass(frozen=True, slots=True)
class Flapper:
    """A node with at least one return in the window: how many, and its state and reachability now."""

    name: str
    node_id: int
    returns: int
    state: str
    reachable: bool


def flapping(now: datetime, window_s: float) -> dict[str, Flapper]:
    """Node name → its flaps in the ``window_s`` before ``now``, for nodes with at least one (two queries)."""
    since = now - timedelta(seconds=window_s)
    cordoned = dict(
        FleetEvent.objects.filter(kind=FleetEvent.Kind.NODE_FLAPPING, started_at__gte=since)
        .order_by("node_id", "started_at")
        .values_list("node_id", "started_at")
    )
    downs: dict[int, list[datetime]] = defaultdict(list)
    facts: dict[int, tuple[str, str, bool]] = {}
    rows = (
        FleetEvent.objects.filter(kind=FleetEvent.Kind.NODE_UNREACHABLE, started_at__gte=since, node__isnull=False)
        .exclude(detail__has_key="partition")
        .values_list("node_id", "node__name", "node__state", "node__reachable", "started_at")
    )
    for node_id, name, state, reachable, at in rows:
        facts[node_id] = (name, state, reachable)
        if node_id not in cordoned or at > cordoned[node_id]:
            downs[node_id].append(at)
    out = {}
    for node_id, times in downs.items():
        name, state, reachable = facts[node_id]
        count = failure_rules.flaps(times, now, down_now=not reachable, window_s=window_s)
        if count:
            out[name] = Flapper(name, node_id, count, state, reachable)
    return out
