"""The fleet at a glance: nodes by state, devices by class, replicas, models that need a look, findings."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse

from dashboard.views import common
from observability.findings import open_findings
from observability.fleet_summary import summary
from placement.reads import node_list

SOCKET = "/ws/console/fleet/"


def node_condition(node: dict[str, Any]) -> str:
    """One word per node for the fleet's strip of tiles: what an operator would act on first."""
    if node.get("lost"):
        return "lost"
    if not node["reachable"]:
        return "unreachable"
    if node["unhealthy_gpus"]:  # unhealthy, or held back (a MIG card with no instances): out of placement
        return "unhealthy"
    return node["state"]


def context() -> dict[str, Any]:
    nodes = node_list()
    for n in nodes:
        n["condition"] = node_condition(n)
    return {"summary": summary(), "nodes": nodes, "findings": open_findings()}


def page(request: HttpRequest) -> HttpResponse:
    return common.page(request, "dashboard/fleet.html", context(), title="Fleet", section="fleet", socket=SOCKET)


def fragment(request: HttpRequest) -> HttpResponse:
    return common.fragment(request, "dashboard/fragments/fleet.html", context())
