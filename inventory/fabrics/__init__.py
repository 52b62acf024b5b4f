"""Which physical fabric each InfiniBand or RoCE port is on, against the names the nodes gave them.

A multi-node replica must never span two InfiniBand fabrics, and the name an
operator typed into a node's agent configuration is only a claim. The
physical fabric of an InfiniBand port is its master subnet manager (the SM
GUID, read through the SM LID the port reports); of a RoCE port, its network.
This module groups ports by that, and reports in words what does not add up.

Pure code: dataclasses in, a report out; no Django, no I/O (an import contract
holds it to that). ``facts`` holds what goes in and comes out; ``analysis``
the grouping, the names and the nodes' fabrics for placement; ``counters``
slow ports and rising error counters; ``subnet_manager`` the SM's history;
``words`` how findings are worded. Every field that may be missing is None when it is unknown,
which is never the same as zero or "none": a report from an older agent that
lacks a field is unknown, not healthy.
"""

from inventory.fabrics.analysis import (
    PortLink,
    PortName,
    PortPlace,
    analyze,
    fabric_kind,
    node_fabric_keys,
    node_fabric_labels,
    physical_ports,
    sm_report,
)
from inventory.fabrics.facts import (
    ERROR_COUNTERS,
    SM_FLAP_CHANGES,
    SM_FLAP_WINDOW,
    FabricReport,
    PhysicalFabric,
    PortFacts,
    PortRef,
    Problem,
    SMChange,
    SMEvent,
    describe_key,
    fabric_id,
)

__all__ = [
    "ERROR_COUNTERS",
    "SM_FLAP_CHANGES",
    "SM_FLAP_WINDOW",
    "FabricReport",
    "PhysicalFabric",
    "PortFacts",
    "PortLink",
    "PortName",
    "PortPlace",
    "PortRef",
    "Problem",
    "SMChange",
    "SMEvent",
    "analyze",
    "describe_key",
    "fabric_id",
    "fabric_kind",
    "node_fabric_keys",
    "node_fabric_labels",
    "physical_ports",
    "sm_report",
]
