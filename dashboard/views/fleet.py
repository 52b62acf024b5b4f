"""The fleet at a glance: nodes by state, devices by class, replicas, models that need a look, findings."""

from __future__ import annotations

import re
from datetime import datetime, tzinfo
from html import escape as html_escape
from typing import Any
from urllib.parse import quote

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.safestring import SafeString, mark_safe

from core import cycles
from dashboard.views import common
from observability.findings import open_findings_listed
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


# What html.escape replaces: a value with none of these (most names, every count) is its own escape.
_SPECIAL = re.compile("[&<>\"']")


def _escape(value: Any) -> str:
    text = str(value)
    return html_escape(text) if _SPECIAL.search(text) else text


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


def _minute(at: datetime, zone: tzinfo | None) -> str:
    """``{{ at|date:"Y-m-d H:i" }}``: the time in the current time zone (as templates show it), to the minute."""
    if zone is not None and timezone.is_aware(at):
        at = at.astimezone(zone)
    return f"{at.year:04d}-{at.month:02d}-{at.day:02d} {at.hour:02d}:{at.minute:02d}"


def finding_items(findings: list[dict[str, Any]]) -> SafeString:
    """The doctor's open findings as list items, as the template's loop drew them (the same bytes).

    Built here for the reason the tiles are: a large fleet's silent nodes are thousands of findings,
    and the loop (an ``{% if %}``, two escaped values and a ``date`` filter each) was most of the
    page's rendering at 10,000 nodes. Findings of one sweep share their times: each is formatted once.
    """
    zone = timezone.get_current_timezone() if settings.USE_TZ else None
    since: dict[datetime, str] = {}
    out = []
    for f in findings:
        at = f["first_seen"]
        if (when := since.get(at)) is None:
            when = since[at] = _escape(_minute(at, zone))
        severity = "bad" if f["severity"] == "critical" else "warn"
        out.append(
            f'<li class="{severity}"><strong>{_escape(f["subject"])}</strong>: {_escape(f["message"])} '
            f"<small>since {when}</small></li>"
        )
    return mark_safe("".join(out))  # every value in it is escaped above


def context() -> dict[str, Any]:
    nodes = node_tiles()  # what a tile shows of each node: the full views were most of a large fleet's page
    for n in nodes:
        n["condition"] = node_condition(n)
    findings = open_findings_listed()  # without last_seen, which the page does not show
    return {
        "summary": summary(),
        "nodes": nodes,
        "tiles": tiles(nodes),
        "findings": findings,
        "finding_items": finding_items(findings),
    }


# Built and drawn with the cycle collector held off (core.cycles), as the rack page is: a tile and
# its counts per node, none of them in a cycle.


def page(request: HttpRequest) -> HttpResponse:
    with cycles.uncollected():
        return common.page(
            request, "dashboard/fleet.html", context(), title="Fleet", section="fleet", socket=SOCKET
        ).render()


def fragment(request: HttpRequest) -> HttpResponse:
    with cycles.uncollected():
        return common.fragment(request, "dashboard/fragments/fleet.html", context())
