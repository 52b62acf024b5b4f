"""The InfiniBand/RoCE fabrics report and one fabric's map, from the stored ports.

The analysis itself is :func:`inventory.fabrics.analyze` (pure); this module
only feeds it the IBPort and SubnetManagerChange rows and shapes the answer.

A fabric's map needs an ibnetdiscover scan, and scans are not stored yet:
until they are, the map is absent and ``map_note`` says why, so nobody takes
an empty drawing for an empty fabric.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from inventory.fabrics import ERROR_COUNTERS, FabricReport, PortFacts, SMChange, analyze
from inventory.models import IBPort, SubnetManagerChange

# The SM history the analysis looks at: its flapping window is an hour and a
# single failover stays reported for a day; a week shows the pattern.
SM_HISTORY = timedelta(days=7)

NO_SCAN = (
    "No scan of this fabric has been uploaded, so there is no map to draw yet; "
    "the adapters below are this cluster's own, as their nodes last reported them."
)


def analysis(now: datetime | None = None) -> FabricReport:
    now = now or timezone.now()
    ports = [
        PortFacts(
            node=p["node__name"],
            hca=p["hca"],
            port=p["port"],
            state=p["state"] or None,
            phys_state=p["phys_state"] or None,
            rate_gbps=p["rate_gbps"],
            link_layer=p["link_layer"] or None,
            node_guid=p["node_guid"] or None,
            port_guid=p["port_guid"] or None,
            sm_lid=p["sm_lid"],
            sm_guid=p["sm_guid"] or None,
            sm_error=p["sm_error"] or None,
            network=p["network"] or None,
            declared_fabric=p["fabric"] or None,
            counters=p["counters"] if isinstance(p["counters"], dict) else None,
            previous_counters=p["previous_counters"] if isinstance(p["previous_counters"], dict) else None,
        )
        for p in IBPort.objects.values(
            "node__name",
            "hca",
            "port",
            "state",
            "phys_state",
            "rate_gbps",
            "link_layer",
            "node_guid",
            "port_guid",
            "sm_lid",
            "sm_guid",
            "sm_error",
            "network",
            "fabric",
            "counters",
            "previous_counters",
        )
    ]
    changes = [
        SMChange(c["node__name"], c["hca"], c["port"], c["old_sm_guid"] or None, c["new_sm_guid"] or None, c["at"])
        for c in SubnetManagerChange.objects.filter(at__gte=now - SM_HISTORY).values(
            "node__name", "hca", "port", "old_sm_guid", "new_sm_guid", "at"
        )
    ]
    return analyze(ports, changes, now)


def fabrics_report(now: datetime | None = None) -> dict[str, Any]:
    """Every physical fabric, the problems found, and each node's fabric (or why it has none)."""
    return analysis(now).as_json()


def topology(fabric: str, now: datetime | None = None) -> dict[str, Any] | None:
    """One physical fabric by its id or key, with its problems and the cluster's adapters on it; None if unknown."""
    report = analysis(now)
    ph = report.fabric(fabric)
    if ph is None:
        return None
    whole = report.as_json()
    view = next(p for p in whole["physical"] if p["key"] == ph.key)
    view["problems"] = [p for p in whole["problems"] if p["physical"] == ph.key]
    view["live"] = _live(ph.ports)
    view["map_note"] = NO_SCAN
    return view


def _live(refs) -> list[dict[str, Any]]:
    """The fabric's ports as their nodes last reported them: state, rate, non-zero error counters."""
    wanted = {(r.node, r.hca, r.port) for r in refs}
    nodes = sorted({r.node for r in refs})
    out = []
    for p in IBPort.objects.filter(node__name__in=nodes).values(
        "node__name", "hca", "port", "state", "phys_state", "rate_gbps", "node_guid", "counters"
    ):
        if (p["node__name"], p["hca"], p["port"]) not in wanted:
            continue
        counters = p["counters"] if isinstance(p["counters"], dict) else {}
        entry = {
            "node": p["node__name"],
            "hca": p["hca"],
            "port": p["port"],
            "state": p["state"],
            "phys_state": p["phys_state"],
            "errors": {k: v for k, v in counters.items() if k in ERROR_COUNTERS and isinstance(v, int) and v > 0},
        }
        if p["rate_gbps"] is not None:
            entry["rate_gbps"] = p["rate_gbps"]
        if p["node_guid"]:
            entry["node_guid"] = p["node_guid"]
        out.append(entry)
    return sorted(out, key=lambda e: (e["node"], e["hca"], e["port"]))
