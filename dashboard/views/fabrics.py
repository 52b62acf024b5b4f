"""InfiniBand and RoCE fabrics: each with its subnet manager(s) and problems, and one fabric's map."""

from __future__ import annotations

from typing import Any

from django.http import Http404, HttpRequest, HttpResponse
from django.urls import reverse

from dashboard.topology_map import TopologyRenderer
from dashboard.views import common
from inventory.models import FabricScan
from inventory.reads import fabrics_report, topology

SOCKET = "/ws/console/fleet/"
# A scan's upload is not published live (nor is an unchanged report, which is
# most of them), so a fabric's page also re-fetches on this period while live:
# a map that lands appears without a reload.
REFRESH_S = 10


def context() -> dict[str, Any]:
    report = fabrics_report()
    # The list shows when and by whom, never the map: the text and the parsed map stay in the database.
    scans = {s.fabric_key: s for s in FabricScan.objects.select_related("node").defer("output", "fabric_map")}
    fabrics = [
        {
            **ph,
            "problems": [p for p in report["problems"] if p["physical"] == ph["key"]],
            "scan": scans.get(ph["key"]),
        }
        for ph in report["physical"]
    ]
    keys = {ph["key"] for ph in report["physical"]}
    return {
        "fabrics": fabrics,
        # Problems about no one physical fabric: a node on two, a port whose SM cannot be read.
        "other_problems": [p for p in report["problems"] if p["physical"] not in keys],
        "without": sorted((n, v["why_not"]) for n, v in report["nodes"].items() if v["why_not"]),
    }


def page(request: HttpRequest) -> HttpResponse:
    return common.page(request, "dashboard/fabrics.html", context(), title="Fabrics", section="fabrics", socket=SOCKET)


def fragment(request: HttpRequest) -> HttpResponse:
    return common.fragment(request, "dashboard/fragments/fabrics.html", context())


def topology_context(fabric: str) -> dict[str, Any]:
    view = topology(fabric)
    if view is None:
        raise Http404(f"no fabric {fabric!r}")
    live = {(p["node"], p["hca"]): p for p in view["live"]}
    drawing = TopologyRenderer(view["map"], live).render() if view.get("map") else None
    return {
        "fabric": view,
        "drawing": drawing,
        "nodes": sorted({p["node"] for p in view["live"]}),
        "by_node": by_node(view["live"]),
        "refresh_s": REFRESH_S,
    }


def by_node(live: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The fabric's ports of ours, one row per node: a fabric of 500 nodes is 2,000 ports, too many to list."""
    rows: dict[str, dict[str, Any]] = {}
    for p in live:
        row = rows.setdefault(p["node"], {"node": p["node"], "ports": 0, "active": 0, "down": [], "errors": []})
        row["ports"] += 1
        if "ACTIVE" in str(p.get("state") or "").upper():
            row["active"] += 1
        else:
            row["down"].append(f"{p['hca']}/{p['port']} {p.get('state') or 'not reported'}")
        row["errors"] += [f"{p['hca']}/{p['port']} {k} {v}" for k, v in p["errors"].items()]
        if p.get("rate_gbps"):
            row.setdefault("rates", set()).add(p["rate_gbps"])
    return [rows[n] for n in sorted(rows)]


def topology_page(request: HttpRequest, fabric: str) -> HttpResponse:
    context = topology_context(fabric)
    return common.page(
        request,
        "dashboard/topology.html",
        context,
        title=f"Fabric {context['fabric']['label']}",
        section="fabrics",
        socket=SOCKET,
        crumbs=[("Fabrics", reverse("admin:console-fabrics"))],
    )


def topology_fragment(request: HttpRequest, fabric: str) -> HttpResponse:
    return common.fragment(request, "dashboard/fragments/topology.html", topology_context(fabric))
