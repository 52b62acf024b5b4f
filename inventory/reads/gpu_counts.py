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

The count reads one row per node and class (inventory.models.NodeDevices),
which a trigger on the GPU table keeps by these rules whoever writes the
cards (migration 0012, 0015), and matches the holders' GPUs against it as
bits: at 10,000 nodes the ~70,000 GPU rows a request used to read were most
of the summary's time (~185 → ~30 ms of its query). A test holds it to
inventory.devices.count_by_class, card by card, on random fleets
(tests/inventory/test_device_counts.py).

A holder's entry names a GPU only as an integer: not a string ("1"), a float
(1.0) or a boolean (JSON true is no GPU 1, whatever Python's isinstance says).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

from django.db import connection, transaction
from django.db.models import QuerySet

from inventory.models import Node, NodeDevices


class DeviceCounts(NamedTuple):
    """Devices by class (total, used, free, unhealthy, held), and the ids of the nodes whose every device is free.

    ``free_nodes`` holds a node with at least one device and none of them
    used, unhealthy or held back, whatever the node's state (the caller
    knows which nodes are open). Empty when it was not asked for.
    """

    classes: list[dict[str, Any]]
    free_nodes: frozenset[int]


def device_counts(holders: QuerySet, *, free_nodes: bool = True) -> DeviceCounts:
    """The fleet's devices by class, and the nodes entirely free; ``holders`` a queryset of (node id, GPU indices) rows.

    ``free_nodes`` False leaves the nodes out: that is a third of the
    query's time at 10,000 nodes, which ``/metrics`` does without.
    """
    holders_sql, params = holders.query.sql_with_params()
    sql = COUNTED.format(holders=holders_sql, **(NODES if free_nodes else BY_CLASS))
    classes, free = [], set()
    for cls, node, total, used, sick, held, free_open in aggregate(sql, params):
        if cls is not None:
            classes.append(
                {"class": cls, "total": total, "used": used, "free": free_open, "unhealthy": sick, "held": held}
            )
        else:
            free.add(node)
    return DeviceCounts(sorted(classes, key=lambda c: c["class"]), frozenset(free))


# What the holders hold, per node: each index a holder names as an integer (a JSON number without a
# fraction, which Python decodes to an int; never a string, a boolean or a float), below 63 as bits
# and the rest as a list, which may name an index twice (DEVICES counts each once). A DISTINCT in
# that aggregate sorted every node's indices: 7 of the query's 50 ms at 10,000 nodes, for the few
# MIG instances it is for. Ten digits at most, which is past any GPU number (a PostgreSQL integer),
# so the cast cannot overflow. {holders} is the caller's query.
HELD = """
holders(node_id, gpu_indices) AS ({holders}),
named AS (
    SELECT h.node_id, (e #>> '{{}}')::bigint AS idx
    FROM holders h,
         jsonb_array_elements(
             CASE WHEN jsonb_typeof(h.gpu_indices) = 'array' THEN h.gpu_indices ELSE '[]'::jsonb END
         ) AS e
    WHERE jsonb_typeof(e) = 'number' AND (e #>> '{{}}') ~ '^[0-9]{{1,10}}$'
),
held AS (
    SELECT node_id,
           COALESCE(bit_or(1::bigint << idx::int) FILTER (WHERE idx < 63), 0) AS bits,
           jsonb_agg(idx) FILTER (WHERE idx >= 63) AS more
    FROM named GROUP BY node_id
)
"""

# Per row of inventory_nodedevices (a node's devices of one class, which a trigger keeps from its GPU
# rows: inventory.models.NodeDevices), its open devices something holds: one AND of bits, and the
# list only on the few nodes where a holder names an index past 62 (a MIG instance).
DEVICES = f"""
d AS (
    SELECT d.node_id, d.gpu_class, d.total, d.unhealthy, d.held, d.open,
           (bit_count((d.open_bits & COALESCE(u.bits, 0))::bit(64))
            + CASE WHEN u.more IS NULL OR d.open_more = '[]'::jsonb THEN 0
                   ELSE (SELECT count(DISTINCT m) FROM jsonb_array_elements(u.more) m WHERE d.open_more @> m) END
           )::int AS used
    FROM {NodeDevices._meta.db_table} d LEFT JOIN held u ON u.node_id = d.node_id
)
"""

# Counted by class, from one row per node and class rather than one per GPU. NODES adds a row for
# each node whose every device is free: a row for every node was 10,000 rows to send and read at
# 10,000 nodes, for the fraction the fabrics' largest free block counts (2,000 in bench/scale.py).
COUNTED = f"""
WITH {HELD}, {DEVICES}
SELECT d.gpu_class, {{node}}, sum(d.total)::int, sum(d.used)::int, sum(d.unhealthy)::int, sum(d.held)::int,
       COALESCE(sum(d.open - d.used) FILTER (WHERE n.state = 'ready' AND n.reachable), 0)::int
FROM d JOIN {Node._meta.db_table} n ON n.id = d.node_id
GROUP BY {{groups}}
"""
BY_CLASS = {"node": "NULL::int", "groups": "d.gpu_class"}
NODES = {
    "node": "d.node_id",
    "groups": "GROUPING SETS ((d.gpu_class), (d.node_id)) "
    "HAVING GROUPING(d.node_id) = 1 OR (sum(d.total) > 0 AND sum(d.open - d.used) = sum(d.total))",
}


def aggregate(sql: str, params: Iterable[Any] = ()) -> list[tuple]:
    """Run one aggregate query and return its rows."""
    # A few aggregates over indexed joins: compiling them (PostgreSQL's JIT,
    # tempted by the row estimates) costs more than running them.
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL jit = off")
        cursor.execute(sql, list(params))
        return cursor.fetchall()
