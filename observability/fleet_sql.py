"""The fleet summary's counts computed in PostgreSQL, for fleets where reading every GPU row costs too much.

Two thousand nodes are fourteen thousand GPU rows; turning each into Python
objects takes longer than the summary's whole budget (100 ms). On
PostgreSQL the same counts are a handful of aggregate queries, each
returning a few rows. The devices by class are counted by the inventory
(``inventory.reads.gpu_counts``, which ``/metrics`` reads too); here are
the rest: nodes, fabrics, replicas. Tests hold each to the same count over
the node and replica lists (tests/observability/summary_spec.py).
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Count, F, Func, IntegerField, Sum

from inventory.models import Node
from inventory.reads import gpu_counts
from placement.models import Replica, ReplicaState, Shard

# Per declared fabric (a key of a node's ``fabrics``): its nodes, those holding weights (any object in
# ``weights``), the distinct names of those weights (name, else path; neither is Python's str(None),
# "None", as the node list writes it), and its nodes ready, reachable and among the free nodes
# (%s, an array of node ids). Counted here, where the names alone were fetched and counted in Python,
# half of the fabrics' time at 10,000 nodes.
FABRIC_COUNTS = f"""
WITH declared AS (
    SELECT n.id, n.state, n.reachable, f.name AS fabric
    FROM {Node._meta.db_table} n,
         jsonb_object_keys(CASE WHEN jsonb_typeof(n.fabrics) = 'object' THEN n.fabrics ELSE '{{}}' END) AS f(name)
),
weights AS (
    SELECT n.id, COALESCE(w ->> 'name', w ->> 'path', 'None') AS model
    FROM {Node._meta.db_table} n,
         jsonb_array_elements(CASE WHEN jsonb_typeof(n.weights) = 'array' THEN n.weights ELSE '[]'::jsonb END) AS w
    WHERE jsonb_typeof(w) = 'object' AND jsonb_typeof(n.fabrics) = 'object'
),
models AS (
    SELECT d.fabric, count(DISTINCT w.model) AS n FROM declared d JOIN weights w ON w.id = d.id GROUP BY d.fabric
)
SELECT d.fabric, count(*),
       count(*) FILTER (WHERE d.id IN (SELECT id FROM weights)),
       COALESCE(max(m.n), 0),
       count(*) FILTER (WHERE d.reachable AND d.state = 'ready' AND d.id IN (SELECT unnest(%s::bigint[])))
FROM declared d LEFT JOIN models m ON m.fabric = d.fabric
GROUP BY d.fabric
"""


def node_totals() -> dict[str, int]:
    totals = {"total": 0, "ready": 0, "cordoned": 0, "draining": 0, "unreachable": 0}
    for state, reachable, n in Node.objects.order_by().values_list("state", "reachable").annotate(n=Count("id")):
        totals["total"] += n
        totals[state if reachable else "unreachable"] += n
    return totals


def fabrics(free_nodes: Collection[int]) -> list[dict[str, Any]]:
    """Per declared fabric, as ``fleet_summary._fabrics`` counts it; ``free_nodes`` those whose every device is free."""
    rows = gpu_counts.aggregate(FABRIC_COUNTS, [list(free_nodes)])
    # Sorted here, by code point as the row-by-row path sorts, not by the database's collation.
    return [
        {"fabric": f, "nodes": n, "nodes_with_weights": w, "largest_free_block": free, "models_present": m}
        for f, n, w, m, free in sorted(rows)
    ]


def replica_totals() -> dict[str, int]:
    totals = {"total": 0, "ready": 0, "starting": 0, "stopping": 0, "failed": 0, "fetching": 0, "stale": 0}
    for state, n in Replica.objects.order_by().values_list("state").annotate(n=Count("id")):
        totals["total"] += n
        totals["starting" if state == ReplicaState.PENDING else state] += n
    totals["fetching"] = (
        Shard.objects.filter(state__in=["pending", "fetching"], fetch_done__isnull=False)
        .values("replica_id")
        .distinct()
        .count()
    )
    totals["stale"] = (
        Replica.objects.filter(profile__isnull=False)
        .exclude(profile_fingerprint="")
        .exclude(profile__fingerprint=F("profile_fingerprint"))
        .count()
    )
    return totals


def idle_replicas(now: datetime, threshold: timedelta) -> list[dict[str, Any]]:
    rows = (
        Replica.objects.filter(state=ReplicaState.READY, last_used_at__lte=now - threshold)
        .annotate(gpus=Sum(Func(F("shards__gpu_indices"), function="jsonb_array_length", output_field=IntegerField())))
        .values_list("id", "model__name", "last_used_at", "gpus")
    )
    idle = [
        {"id": pk, "model": model, "idle_seconds": int((now - used).total_seconds()), "gpus": gpus or 0}
        for pk, model, used, gpus in rows
    ]
    return sorted(idle, key=lambda r: -r["idle_seconds"])
