"""The report schema's column limits: which columns each value of a report lands in.

``inventory.report_schema`` is pure and checks a report against a table of
limits keyed by path ("gpus[].memory_mb"); this module builds that table from
the columns each path is written to, their limits read by ``core.columns``
(the one home of column limits, which the API's body checks read too), so
narrowing a column narrows what a report may carry, with no second number to
forget.

Which path lands in which column is written once, in ``REPORT_COLUMNS``,
beside ``inventory.writes.ingest``'s mapping; ``tests/inventory/test_bounds.py``
checks that every bounded column ingest writes is in it.
"""

from __future__ import annotations

from functools import cache

from django.db import models

from core.columns import field_limit, narrowest
from inventory.models import GPU, IBPort, Node, NVLinkDomain, SubnetManagerChange
from inventory.report_schema import Bounds, Limit

# Path in the report → every (model, field) the value is written to. Paths
# follow report_schema: "[]" is any item of a list, "{}" any key of an object.
REPORT_COLUMNS: dict[str, list[tuple[type[models.Model], str]]] = {
    "agent_version": [(Node, "agent_version")],
    "hostname": [(Node, "hostname")],
    "address": [(Node, "mgmt_addr")],
    "host.hostname": [(Node, "hostname")],
    "host.os": [(Node, "os")],
    "host.os_version": [(Node, "os_version")],
    "host.arch": [(Node, "arch")],
    "host.memory_mb": [(Node, "memory_mb")],
    "imex.state": [(Node, "imex_state")],
    "fabrics{}": [(IBPort, "fabric")],
    "gpus[].index": [(GPU, "index")],
    "gpus[].uuid": [(GPU, "uuid")],
    "gpus[].name": [(GPU, "name")],
    "gpus[].class": [(GPU, "gpu_class")],
    "gpus[].memory_mb": [(GPU, "memory_mb")],
    "gpus[].pci_bus": [(GPU, "pci_bus")],
    "gpus[].numa": [(GPU, "numa")],
    "gpus[].mig_mode": [(GPU, "mig_mode")],
    "gpus[].parent": [(GPU, "parent_index")],
    "gpus[].mig_uuid": [(GPU, "mig_uuid")],
    "gpus[].mig_profile": [(GPU, "mig_profile")],
    "gpus[].fabric.state": [(GPU, "fabric_state")],
    "gpus[].fabric.status": [(GPU, "fabric_status")],
    "gpus[].fabric.cluster_uuid": [(GPU, "cluster_uuid"), (NVLinkDomain, "cluster_uuid")],
    "gpus[].fabric.clique_id": [(GPU, "clique_id"), (NVLinkDomain, "clique_id")],
    "gpus[].fabric.health_summary": [(GPU, "fabric_health_summary")],
    "gpus[].fabric.bandwidth": [(GPU, "fabric_bandwidth")],
    "ib_ports[].hca": [(IBPort, "hca"), (SubnetManagerChange, "hca")],
    "ib_ports[].port": [(IBPort, "port"), (SubnetManagerChange, "port")],
    "ib_ports[].state": [(IBPort, "state")],
    "ib_ports[].phys_state": [(IBPort, "phys_state")],
    "ib_ports[].link_layer": [(IBPort, "link_layer")],
    "ib_ports[].node_guid": [(IBPort, "node_guid")],
    "ib_ports[].port_guid": [(IBPort, "port_guid")],
    "ib_ports[].sm_lid": [(IBPort, "sm_lid")],
    "ib_ports[].sm_guid": [(IBPort, "sm_guid"), (SubnetManagerChange, "new_sm_guid")],
    "ib_ports[].network": [(IBPort, "network")],
    "ib_ports[].fabric": [(IBPort, "fabric")],
}


@cache
def report_bounds() -> Bounds:
    """The limits a report is checked against (report_schema.report_problems' ``bounds``)."""
    table: dict[str, Limit] = {}
    for path, columns in REPORT_COLUMNS.items():
        limits = [limit for model, name in columns if (limit := field_limit(model, name)) is not None]
        if limits:
            table[path] = narrowest(limits)
    return table
