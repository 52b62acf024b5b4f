"""The fleet summary's counts computed in PostgreSQL, for fleets where reading every GPU row costs too much.

Two thousand nodes are fourteen thousand GPU rows; turning each into Python
objects takes longer than the summary's whole budget (100 ms). On
PostgreSQL the same counts are a handful of aggregate queries, each
returning a few rows. The rules are the ones ``inventory.devices`` applies
row by row — a carved card counts as its instances, unhealthy wins over used,
a MIG card with no instances and an instance without its MIG UUID are held
back — and a test compares both paths on the same fleet, so they cannot
drift apart. Other databases (SQLite, embedded) take the row-by-row path.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta
from typing import Any

from django.db import connection, transaction
from django.db.models import Count, F, Func, IntegerField, Sum

from inventory.devices import MIG_INDEX_BASE
from inventory.models import GPU, Node
from placement.models import Replica, ReplicaState, Shard

# One row per device (carved cards left out), with what decides how it counts. The GPUs a shard
# holds are unnested once and hash-joined, rather than looked up per GPU row.
DEVICES = f"""
used AS MATERIALIZED (
    SELECT DISTINCT s.node_id, CASE WHEN e.v ~ '^[0-9]{{1,9}}$' THEN e.v::int END AS idx
    FROM {Shard._meta.db_table} s,
         jsonb_array_elements_text(
             CASE WHEN jsonb_typeof(s.gpu_indices) = 'array' THEN s.gpu_indices ELSE '[]'::jsonb END
         ) AS e(v)
),
carved AS MATERIALIZED (
    SELECT DISTINCT node_id, parent_index AS idx FROM {GPU._meta.db_table} WHERE parent_index IS NOT NULL
),
d AS (
    SELECT g.node_id, g.gpu_class,
           g.health <> '[]'::jsonb AS sick,
           ((g.parent_index IS NULL AND g.index < {MIG_INDEX_BASE}
             AND lower(trim(g.mig_mode)) IN ('enabled', 'enable', 'on', 'true'))
            OR (g.parent_index IS NOT NULL AND g.mig_uuid = '')) AS held,
           u.node_id IS NOT NULL AS used
    FROM {GPU._meta.db_table} g
    LEFT JOIN used u ON u.node_id = g.node_id AND u.idx = g.index
    LEFT JOIN carved c ON c.node_id = g.node_id AND c.idx = g.index AND g.parent_index IS NULL
    WHERE c.node_id IS NULL
)
"""

# Counted by class and by node in one pass over the devices.
COUNTS = f"""
WITH {DEVICES}
SELECT d.gpu_class, d.node_id, count(*),
       count(*) FILTER (WHERE NOT sick AND NOT held AND used),
       count(*) FILTER (WHERE sick),
       count(*) FILTER (WHERE NOT sick AND held),
       count(*) FILTER (WHERE NOT sick AND NOT held AND NOT used),
       count(*) FILTER (WHERE NOT sick AND NOT held AND NOT used AND n.state = 'ready' AND n.reachable)
FROM d JOIN {Node._meta.db_table} n ON n.id = d.node_id
GROUP BY GROUPING SETS ((d.gpu_class), (d.node_id))
"""

# The names of the weights on each node's disks, one row per weight.
WEIGHTS = f"""
SELECT n.id, COALESCE(w ->> 'name', w ->> 'path')
FROM {Node._meta.db_table} n,
     jsonb_array_elements(CASE WHEN jsonb_typeof(n.weights) = 'array' THEN n.weights ELSE '[]'::jsonb END) AS w
WHERE jsonb_typeof(w) = 'object' AND n.fabrics IS NOT NULL
"""


def available() -> bool:
    return connection.vendor == "postgresql"


def _rows(sql: str) -> list[tuple]:
    # A few aggregates over indexed joins: compiling them (PostgreSQL's JIT,
    # tempted by the row estimates) costs more than running them.
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL jit = off")
        cursor.execute(sql)
        return cursor.fetchall()


def device_counts() -> tuple[list[dict[str, Any]], dict[int, tuple[int, int]]]:
    """Devices by class, and each node's (devices, free devices)."""
    classes, nodes = [], {}
    for cls, node, total, used, sick, held, free, free_open in _rows(COUNTS):
        if cls is not None:
            row = {"class": cls, "total": total, "used": used, "free": free_open, "unhealthy": sick, "held": held}
            classes.append(row)
        else:
            nodes[node] = (total, free)
    return sorted(classes, key=lambda c: c["class"]), nodes


def node_totals() -> dict[str, int]:
    totals = {"total": 0, "ready": 0, "cordoned": 0, "draining": 0, "unreachable": 0}
    for state, reachable, n in Node.objects.order_by().values_list("state", "reachable").annotate(n=Count("id")):
        totals["total"] += n
        totals[state if reachable else "unreachable"] += n
    return totals


def fabrics(per_node: dict[int, tuple[int, int]]) -> list[dict[str, Any]]:
    """Per declared fabric, as ``fleet_summary._fabrics`` counts it."""
    names: dict[int, set[str]] = defaultdict(set)
    for node, name in _rows(WEIGHTS):
        names[node].add(str(name))
    out: dict[str, dict[str, Any]] = {}
    models: dict[str, set[str]] = defaultdict(set)
    rows = Node.objects.exclude(fabrics__isnull=True).values_list("pk", "state", "reachable", "fabrics")
    for pk, state, reachable, declared in rows:
        total, free = per_node.get(pk, (0, 0))
        for f in declared if isinstance(declared, dict) else {}:
            u = out.setdefault(f, {"fabric": f, "nodes": 0, "nodes_with_weights": 0, "largest_free_block": 0})
            u["nodes"] += 1
            if names.get(pk):
                u["nodes_with_weights"] += 1
                models[f].update(names[pk])
            if reachable and state == "ready" and total and free == total:
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
