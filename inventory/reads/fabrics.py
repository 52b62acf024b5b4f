"""The InfiniBand/RoCE fabrics report and one fabric's map, from the stored ports.

The analysis itself is :func:`inventory.fabrics.analyze` (pure); this module
only feeds it the IBPort and SubnetManagerChange rows and shapes the answer.

A fabric's map comes from its last ``ibnetdiscover`` scan (inventory/writes/scans.py):
drawn with the cluster's own adapters marked on it. Until a scan has been
uploaded the map is absent and ``map_note`` says why, so nobody takes an empty
drawing for an empty fabric; a scan that failed keeps the last good map, and
the note says when it failed and why.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from inventory.fabric_inventory import analyze_inventory
from inventory.fabrics import ERROR_COUNTERS, FabricReport
from inventory.ibnetdiscover import map_from_json
from inventory.models import FabricScan, IBPort
from inventory.topology import build_view

NO_SCAN = (
    "No scan of this fabric has been uploaded, so there is no map to draw yet; "
    "the adapters below are this cluster's own, as their nodes last reported them."
)


def analysis(now: datetime | None = None) -> FabricReport:
    return analyze_inventory(now)


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
    _add_map(view, ph.key)
    return view


def _add_map(view: dict[str, Any], key: str) -> None:
    scan = FabricScan.objects.select_related("node").defer("output").filter(fabric_key=key).first()
    if scan is not None:
        view["scan"] = {
            "node": scan.node.name if scan.node else None,
            "hca": scan.hca or None,
            "port": scan.port,
            "scanned_at": scan.scanned_at,
            "took_ms": scan.took_ms,
            "attempted_at": scan.attempted_at,
            "error": scan.error or None,
            "requested_at": scan.requested_at,
        }
    if scan is None or not scan.fabric_map:
        view["map_note"] = (
            NO_SCAN
            if scan is None or not scan.error
            else (
                f"The scan at {scan.attempted_at:%Y-%m-%d %H:%M:%S} UTC failed ({scan.error}), and no earlier scan "
                "was kept, so there is no map to draw yet."
            )
        )
        return
    # Parsed once, when it was uploaded (inventory/writes/scans.py): a page never reads the text.
    fabric_map = map_from_json(scan.fabric_map)
    hosts = {p["node_guid"]: (p["node"], p["hca"]) for p in view["live"] if p.get("node_guid")}
    view["map"] = build_view(fabric_map, hosts)
    if scan.error:
        view["map_note"] = (
            f"The last scan, at {scan.attempted_at:%Y-%m-%d %H:%M:%S} UTC, failed ({scan.error}); "
            f"this is the map from {scan.scanned_at:%Y-%m-%d %H:%M:%S} UTC."
        )


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
