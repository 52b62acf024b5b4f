"""The fleet at a glance: nodes by state, devices by class, replicas, models that need a look, findings."""

from __future__ import annotations

from html import escape as html_escape
from typing import Any
from urllib.parse import quote

from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils.safestring import SafeString, mark_safe

from dashboard.views import common
from observability.findings import open_findings
from observability.fleet_summary import summary
from placement.reads import node_tiles

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


def _escape(value: Any) -> str:
    return html_escape(str(value))


def tiles(nodes: list[dict[str, Any]]) -> SafeString:
    """The fleet's strip of tiles, one link per node, as the template's loop drew it (the same bytes).

    Built here rather than in the template: at 2,000 nodes the loop (a ``{% url %}`` and a dozen
    variable lookups per tile) was half of the page's time, and it grows with the fleet.
    """
    # html.escape is what Django's escape calls (quote=True); called bare, without escape's lazy-string
    # wrapper and a SafeString per value, since the strip escapes five values a node.
    href = reverse("admin:console-node", args=[_NAME_MARK])
    out = []
    for n in nodes:
        name = _escape(n["id"])
        title = f"{name}: {_escape(n['condition'])}"
        if n.get("gpu_total"):  # a CPU node has neither count; a node off any NVLink domain has no key
            title += f", {_escape(n['gpu_free'])}/{_escape(n['gpu_total'])} devices free"
        if n.get("nvlink_domain"):
            title += f", NVLink {_escape(n['nvlink_domain'])}"
        link = _escape(href.replace(_NAME_MARK, quote(n["id"], safe=_PATH_SAFE)))
        condition = _escape(n["condition"])
        out.append(
            f'<a class="tile" href="{link}" data-node="{name}" data-condition="{condition}" title="{title}"></a>'
        )
    return mark_safe("".join(out))  # every value in it is escaped above


def context() -> dict[str, Any]:
    nodes = node_tiles()  # what a tile shows of each node: the full views were most of a large fleet's page
    for n in nodes:
        n["condition"] = node_condition(n)
    return {"summary": summary(), "nodes": nodes, "tiles": tiles(nodes), "findings": open_findings()}


def page(request: HttpRequest) -> HttpResponse:
    return common.page(request, "dashboard/fleet.html", context(), title="Fleet", section="fleet", socket=SOCKET)


def fragment(request: HttpRequest) -> HttpResponse:
    return common.fragment(request, "dashboard/fragments/fleet.html", context())
