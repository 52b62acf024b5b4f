"""What the API and the console show of the inventory, built by the same functions for both.

Each function returns plain JSON-able data; a key left out means unknown.
The API's serializers (``api/serializers``) describe every shape. The node
listing and one node's page show what is placed there, which is placement's
to read: callers take them from ``placement.reads`` (``node_list``,
``node_detail``), which hands ``inventory.reads.nodes`` the shards.
"""

from inventory.reads.fabrics import fabrics_report, topology
from inventory.reads.nodes import LOAD_FRESH, NodeUsage, load_view, node_logs
from inventory.reads.nvlink import nvlink_report

__all__ = [
    "LOAD_FRESH",
    "NodeUsage",
    "fabrics_report",
    "load_view",
    "node_logs",
    "nvlink_report",
    "topology",
]
