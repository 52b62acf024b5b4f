"""The fleet summary's counts computed in PostgreSQL, for fleets where reading every GPU row costs too much.

Two thousand nodes are fourteen thousand GPU rows; turning each into Python
objects takes longer than the summary's whole budget (100 ms). On
PostgreSQL the same counts are a handful of aggregate queries, each
returning a few rows. The devices by class are counted by the inventory
(``inventory.reads.gpu_counts``, which ``/metrics`` reads too); here are
the rest: nodes, fabrics, replicas. A test compares both paths on the same
fleet, so they cannot drift apart. Other databases (SQLite, embedded) take
the row-by-row path.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Count, F, Func, IntegerField, Sum

from inventory.models import Node
from inventory.reads import gpu_counts
from placement.models import Replica, ReplicaState, Shard

# Per node, one row per weight on its disks (kind "w", the weight's name) and one per fabric it declares
# (kind "f", the fabric's name, with the node's state): the names alone, where decoding every node's
# fabrics (names → adapters) into Python was most of the fabrics' time on a large fleet.
FABRIC_ROWS = f"""
SELECT 'w', n.id, NULL, NULL, COALESCE(w ->> 'name', w ->> 'path')
FROM {Node._meta.db_table} n,
     jsonb_array_elements(CASE WHEN jsonb_typeof(n.weights) = 'array' THEN n.weights ELSE '[]'::jsonb END) AS w
WHERE jsonb_typeof(w) = 'object' AND n.fabrics IS NOT NULL
UNION ALL
SELECT 'f', n.id, n.state, n.reachable, f.name
FROM {Node._meta.db_table} n,
     jsonb_object_keys(CASE WHEN jsonb_typeof(n.fabrics) = 'object' THEN n.fabrics ELSE '{{}}'::jsonb END) AS f(name)
"""


def available() -> bool:
    return gpu_counts.in_database()


def node_totals() -> dict[str, int]:
    totals = {"total": 0, "ready": 0, "cordoned": 0, "draining": 0, "unreachable": 0}
    for state, reachable, n in Node.objects.order_by().values_list("state", "reachable").annotate(n=Count("id")):
        totals["total"] += n
        totals[state if reachable else "unreachable"] += n
    return totals


def fabrics(free_nodes: Collection[int]) -> list[dict[str, Any]]:
    """Per declared fabric, as ``fleet_summary._fabrics`` counts it; ``free_nodes`` those whose every device is free."""
    names: dict[int, set[str]] = defaultdict(set)
    declared = []
    for kind, pk, state, reachable, name in gpu_counts.aggregate(FABRIC_ROWS):
        if kind == "w":
            names[pk].add(str(name))
        else:
            declared.append((pk, state, reachable, name))
    out: dict[str, dict[str, Any]] = {}
    models: dict[str, set[str]] = defaultdict(set)
    for pk, state, reachable, f in declared:
        u = out.setdefault(f, {"fabric": f, "nodes": 0, "nodes_with_weights": 0, "largest_free_block": 0})
        u["nodes"] += 1
        if names.get(pk):
            u["nodes_with_weights"] += 1
            models[f].update(names[pk])
        if reachable and state == "ready" and pk in free_nodes:
            u["largest_free_block"] += 1
    for f, u in out.items():
        u["models_present"] = len(models[f])
    return [out[k] for k in sorted(out)]


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
