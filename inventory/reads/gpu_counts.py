"""How many devices of each class are used, free, unhealthy and held back: the one count of the fleet's GPUs.

``/api/v1/summary`` and ``/metrics`` both read :func:`device_counts`, so the
two cannot disagree on the same fleet. The rules are inventory.devices':

- a device is what placement hands out: a card not carved into MIG
  instances, or one instance (a carved card is counted as its instances);
- unhealthy wins over used: a card that failed under a replica is not
  capacity whoever holds it;
- held back: a card in MIG mode with no instances, an instance without its
  MIG UUID;
- used: held by a shard; free: the rest, counted per class only on an open
  node (ready and reachable), since capacity on a cordoned, draining or
  unreachable node is not capacity. Each node's own free count is kept for
  the fabrics' largest free block.

What holds GPUs is placement's to say (its shards), and placement sits above
the inventory: the caller passes the holders as a queryset of rows
``(node id, GPU indices)``, which the database path reads in the same query.

On PostgreSQL the count is a handful of aggregates, since turning fourteen
thousand GPU rows into Python objects takes longer than the summary's budget;
elsewhere (SQLite, embedded) it is row by row with inventory.devices. A test
holds both equal on the same fleet.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any, NamedTuple

from django.db import connection, transaction
from django.db.models import QuerySet

from inventory import devices
from inventory.devices import MIG_INDEX_BASE
from inventory.models import GPU, Node, NodeState

# Per class, in the order both answers give them.
COUNTS = ("total", "used", "free", "unhealthy", "held")
# What the row-by-row count reads of each GPU.
FIELDS = ("node_id", "index", "gpu_class", "health", "parent_index", "mig_mode", "mig_uuid")


class DeviceCounts(NamedTuple):
    """Devices by class (a dict per class with ``COUNTS``), and each node's (devices, free devices)."""

    classes: list[dict[str, Any]]
    nodes: dict[int, tuple[int, int]]


def in_database() -> bool:
    """Whether the count can run in the database (PostgreSQL)."""
    return connection.vendor == "postgresql"


def device_counts(holders: QuerySet, *, database: bool | None = None) -> DeviceCounts:
    """The fleet's devices by class and per node; ``holders`` a queryset of (node id, GPU indices) rows.

    ``database`` chooses the path; None counts in the database where it can.
    """
    if database if database is not None else in_database():
        return _counted_in_database(holders)
    return _counted_row_by_row(holders)


def _blank(cls: str) -> dict[str, Any]:
    return {"class": cls, **dict.fromkeys(COUNTS, 0)}


# --- row by row ------------------------------------------------------------------------------------------------------


def _used(holders: Iterable[tuple[int, Any]]) -> dict[int, set[int]]:
    """Node id → the GPU indices something holds there; anything but a list of integers holds nothing."""
    used: dict[int, set[int]] = defaultdict(set)
    for node_id, indices in holders:
        if isinstance(indices, list):
            used[node_id].update(i for i in indices if isinstance(i, int))
    return used


def _counted_row_by_row(holders: QuerySet) -> DeviceCounts:
    used = _used(holders)
    gpus: dict[int, list[dict]] = defaultdict(list)
    for g in GPU.objects.order_by().values(*FIELDS):
        gpus[g["node_id"]].append(g)
    open_nodes = set(Node.objects.filter(state=NodeState.READY, reachable=True).values_list("pk", flat=True))
    classes: dict[str, dict[str, Any]] = {}
    nodes: dict[int, tuple[int, int]] = {}
    for node_id, rows in gpus.items():
        per_class = devices.count_by_class(rows, used.get(node_id, set()))
        nodes[node_id] = (sum(c["total"] for c in per_class), sum(c["free"] for c in per_class))
        for c in per_class:
            u = classes.setdefault(c["class"], _blank(c["class"]))
            for key in ("total", "used", "unhealthy", "held"):
                u[key] += c[key]
            if node_id in open_nodes:
                u["free"] += c["free"]
    return DeviceCounts([classes[k] for k in sorted(classes)], nodes)


# --- in PostgreSQL ---------------------------------------------------------------------------------------------------

# One row per device (carved cards left out), with what decides how it counts. The GPUs the holders hold are
# unnested once and hash-joined, rather than looked up per GPU row. {holders} is the caller's query.
DEVICES = f"""
holders(node_id, gpu_indices) AS ({{holders}}),
used AS MATERIALIZED (
    SELECT DISTINCT h.node_id, CASE WHEN e.v ~ '^[0-9]{{{{1,9}}}}$' THEN e.v::int END AS idx
    FROM holders h,
         jsonb_array_elements_text(
             CASE WHEN jsonb_typeof(h.gpu_indices) = 'array' THEN h.gpu_indices ELSE '[]'::jsonb END
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
COUNTED = f"""
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


def aggregate(sql: str, params: Iterable[Any] = ()) -> list[tuple]:
    """Run one aggregate query and return its rows."""
    # A few aggregates over indexed joins: compiling them (PostgreSQL's JIT,
    # tempted by the row estimates) costs more than running them.
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL jit = off")
        cursor.execute(sql, list(params))
        return cursor.fetchall()


def _counted_in_database(holders: QuerySet) -> DeviceCounts:
    holders_sql, params = holders.query.sql_with_params()
    classes, nodes = [], {}
    for cls, node, total, used, sick, held, free, free_open in aggregate(COUNTED.format(holders=holders_sql), params):
        if cls is not None:
            classes.append(
                {"class": cls, "total": total, "used": used, "free": free_open, "unhealthy": sick, "held": held}
            )
        else:
            nodes[node] = (total, free)
    return DeviceCounts(sorted(classes, key=lambda c: c["class"]), nodes)
