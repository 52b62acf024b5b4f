"""The console's strip of tiles counted from a row per node and class, not from every GPU row of the fleet.

A tile shows a node's devices and free devices, whether any device is out of
placement, and the NVLink domain all its cards joined: what the node list
works out from each of the node's GPU rows (seventy thousand at 10,000
nodes, half the fleet page's time). The counts come from ``inventory.models.NodeDevices`` (a row per
node and class, kept by a trigger by inventory.devices' rules: migration
0012), matched against what the shards hold as bits, as the summary's counts
are (``inventory.reads.gpu_counts``); the domain from one aggregate per node
with a card in a domain; the lines saying which devices are out of placement
from the GPU rows of only the nodes that have one, by inventory.devices
itself.

The tiles are the node list's (``tests/inventory/test_tiles.py`` holds
them to it on random fleets): what the shards hold is ``NodeUsage``'s
word, the node list's, with its integers as it reads them.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from django.db import connection

from core import cycles
from core.jsonrows import values_decoded_once
from inventory import devices
from inventory.models import GPU, Node, NodeDevices, NVLinkDomain
from inventory.reads.nodes import NodeUsage

# Below this, a device's index is a bit of NodeDevices.open_bits; from it on, an entry of open_more.
_BITS = 63
# Per node with a card in an NVLink domain: its cards in one (how many, the lowest and highest domain id),
# then, once per such node, how many cards it has. Grouped first and counted after, by the indexes on
# the domain and on the node: the ORM's form of it counted a node's cards once per card in a domain.
DOMAIN_CARDS = f"""
SELECT j.node_id, j.n,
       (SELECT count(*) FROM {GPU._meta.db_table} c WHERE c.node_id = j.node_id AND c.parent_index IS NULL),
       j.low, j.high
FROM (SELECT node_id, count(*) AS n, min(domain_id) AS low, max(domain_id) AS high
      FROM {GPU._meta.db_table} WHERE domain_id IS NOT NULL AND parent_index IS NULL GROUP BY node_id) j
"""
# What inventory.devices reads of a GPU to say why a device is out of placement.
_PLACEMENT_FIELDS = ("node_id", "index", "parent_index", "gpu_class", "health", "mig_mode", "mig_uuid")


def node_tiles(usage: NodeUsage) -> list[dict[str, Any]]:
    """Every node by name with what the console's strip of tiles shows of it, and no more.

    ``id``, ``state``, ``reachable``, ``lost``, ``gpu_total``, ``gpu_free``,
    ``unhealthy_gpus`` and ``nvlink_domain`` as the node list gives them (the
    same counting and domain rules), without the node's other columns: the
    strip of a large fleet read every node's labels, disks and engines only to
    drop them.
    """
    with cycles.uncollected():
        return _tiles(usage)


def _tiles(usage: NodeUsage) -> list[dict[str, Any]]:
    totals, out_of_placement = _counts(usage)
    lines = _out_of_placement_lines(out_of_placement)
    domains = _domains()
    out = []
    for pk, name, state, reachable, lost in Node.objects.order_by("name").values_list(
        "pk", "name", "state", "reachable", "lost"
    ):
        total, free = totals.get(pk, (0, 0))
        view = {"id": name, "state": state, "reachable": reachable, "lost": lost, "gpu_total": total}
        view["gpu_free"] = free
        view["unhealthy_gpus"] = lines.get(pk) or []
        if (domain := domains.get(pk)) is not None:
            view["nvlink_domain"] = domain
        out.append(view)
    return out


def _counts(usage: NodeUsage) -> tuple[dict[int, tuple[int, int]], set[int]]:
    """Node id → (devices, free devices), and the nodes with a device unhealthy or held back.

    Free is a class's open devices less those the node's shards hold, as
    inventory.devices.count_by_class counts them: used counts only an open
    device (unhealthy wins over used).
    """
    totals: dict[int, list[int]] = defaultdict(lambda: [0, 0])
    flagged: set[int] = set()
    bits: dict[int, int] = {}
    fields = ("node_id", "total", "unhealthy", "held", "open", "open_bits", "open_more")
    for row in values_decoded_once(NodeDevices.objects.order_by(), fields, ("open_more",)):
        node_id = row["node_id"]
        counted = totals[node_id]
        counted[0] += row["total"]
        used = usage.used.get(node_id)
        held = 0
        if used:
            if node_id not in bits:
                bits[node_id] = sum(1 << i for i in used if 0 <= i < _BITS)
            held = (row["open_bits"] & bits[node_id]).bit_count()
            if row["open_more"]:
                held += sum(1 for i in row["open_more"] if i in used)
        counted[1] += row["open"] - held
        if row["unhealthy"] or row["held"]:
            flagged.add(node_id)
    return {pk: (total, free) for pk, (total, free) in totals.items()}, flagged


def _out_of_placement_lines(node_ids: set[int]) -> dict[int, list[str]]:
    """inventory.devices.out_of_placement of each of these nodes, from its GPU rows in the listing's order."""
    if not node_ids:
        return {}
    gpus: dict[int, list[dict]] = defaultdict(list)
    for g in GPU.objects.filter(node_id__in=node_ids).order_by("node_id", "index").values(*_PLACEMENT_FIELDS):
        gpus[g["node_id"]].append(g)
    return {pk: devices.out_of_placement(rows) for pk, rows in gpus.items()}


def _domains() -> dict[int, str]:
    """Node id → the key of the NVLink domain every one of its cards joined (the node list's rule).

    Only a node with a card in a domain can have one, and has it when that is
    every card it has and one domain: its cards in a domain are counted (by
    the domain's index), and beside them all its cards (by the node's): a
    count of every card of the fleet, grouped by node, took five times as long.
    """
    keys = dict(
        (pk, NVLinkDomain.key_of(uuid, clique))
        for pk, uuid, clique in NVLinkDomain.objects.values_list("pk", "cluster_uuid", "clique_id")
    )
    with connection.cursor() as cursor:
        cursor.execute(DOMAIN_CARDS)
        rows = cursor.fetchall()
    return {
        node_id: keys[low]
        for node_id, in_domain, n, low, high in rows
        if in_domain == n and low == high and low in keys
    }
