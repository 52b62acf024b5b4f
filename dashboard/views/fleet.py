"""The fleet at a glance: nodes by state, devices by class, replicas, models that need a look, findings."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

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


# The marker reverse() is given once for the whole strip; each tile's name replaces it, quoted as
# reverse() quotes a path argument (Django's iri_to_uri-safe set for paths).
_NAME_MARK = "NODE-NAME-MARK"
_PATH_SAFE = "!$&'()*+,;=/~:@"


def tiles(nodes: list[dict[str, Any]]) -> SafeString:
    """The fleet's strip of tiles, one link per node, as the template's loop drew it (the same bytes).

    Built here rather than in the template: at 2,000 nodes the loop (a ``{% url %}`` and a dozen
    variable lookups per tile) was half of the page's time, and it grows with the fleet.
    """
    href = reverse("admin:console-node", args=[_NAME_MARK])
    out = []
    for n in nodes:
        name = escape(n["id"])
        title = f"{name}: {escape(n['condition'])}"
        if n.get("gpu_total"):  # a CPU node has neither count; a node off any NVLink domain has no key
            title += f", {escape(n['gpu_free'])}/{escape(n['gpu_total'])} devices free"
        if n.get("nvlink_domain"):
            title += f", NVLink {escape(n['nvlink_domain'])}"
        link = escape(href.replace(_NAME_MARK, quote(n["id"], safe=_PATH_SAFE)))
        condition = escape(n["condition"])
        out.append(
            f'<a class="tile" href="{link}" data-node="{name}" data-condition="{condition}" title="{title}"></a>'
        )
    return mark_safe("".join(out))  # every value in it is escaped above


def context() -> dict[str, Any]:
    nodes = node_list()
    for n in nodes:
        n["condition"] = node_condition(n)
    return {"summary": summary(), "nodes": nodes, "tiles": tiles(nodes), "findings": open_findings()}


def page(request: HttpRequest) -> HttpResponse:
    return common.page(request, "dashboard/fleet.html", context(), title="Fleet", section="fleet", socket=SOCKET)


def fragment(request: HttpRequest) -> HttpResponse:
    return common.fragment(request, "dashboard/fragments/fleet.html", context())
