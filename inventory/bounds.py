"""The report schema's column limits, read from the models the report lands in.

``inventory.report_schema`` is pure and checks a report against a table of
limits keyed by path ("gpus[].memory_mb"); this module builds that table from
the model fields themselves (a CharField's ``max_length``, an integer field's
range on this database), so narrowing a column narrows what a report may
carry, with no second number to forget.

Which path lands in which column is written once, in ``REPORT_COLUMNS``,
beside ``inventory.ingest``'s mapping; ``tests/inventory/test_bounds.py``
checks that every bounded column ingest writes is in it.
"""

from __future__ import annotations

from functools import cache

from django.db import connection, models

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


def field_limit(model: type[models.Model], name: str) -> Limit | None:
    """What one column holds: a CharField's length, an integer field's range here; None for anything else."""
    field = model._meta.get_field(name)
    if isinstance(field, models.CharField) and field.max_length:
        return field.max_length
    if isinstance(field, models.IntegerField):  # every integer field, small to big, positive or not
        low, high = connection.ops.integer_field_range(field.get_internal_type())
        return (low if low is not None else -(2**63), high if high is not None else 2**63 - 1)
    return None


def narrowest(limits: list[Limit]) -> Limit:
    """The limit every column of a value can hold: the shortest length, or the tightest range."""
    if all(isinstance(x, int) for x in limits):
        return min(limits)  # type: ignore[type-var]
    ranges = [x for x in limits if isinstance(x, tuple)]
    return (max(low for low, _ in ranges), min(high for _, high in ranges))


@cache
def report_bounds() -> Bounds:
    """The limits a report is checked against (report_schema.report_problems' ``bounds``)."""
    table: dict[str, Limit] = {}
    for path, columns in REPORT_COLUMNS.items():
        limits = [limit for model, name in columns if (limit := field_limit(model, name)) is not None]
        if limits:
            table[path] = narrowest(limits)
    return table
