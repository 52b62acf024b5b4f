"""InfiniBand and RoCE fabrics: each with its subnet manager(s) and problems, and one fabric's map."""

from __future__ import annotations

from typing import Any

from django.http import Http404, HttpRequest, HttpResponse
from django.urls import reverse

from dashboard.topology_map import TopologyRenderer, scan_state
from dashboard.views import common
from inventory.models import FabricScan
from inventory.views_data import fabrics_report, topology

SOCKET = "/ws/console/fleet/"


def context() -> dict[str, Any]:
    report = fabrics_report()
    scans = {s.fabric_key: s for s in FabricScan.objects.select_related("node")}
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
    scan = scan_state(view["key"])
    live = {(p["node"], p["hca"]): p for p in view["live"]}
    drawing = TopologyRenderer(scan.view, live).render() if scan.view else None
    return {"fabric": view, "scan": scan, "drawing": drawing, "nodes": sorted({p["node"] for p in view["live"]})}


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
