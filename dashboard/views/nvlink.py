"""NVLink domains drawn as racks, with what keeps each tray out; and what losing a tray or a rack would do."""

from __future__ import annotations

from typing import Any

from django.http import Http404, HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import reverse

from core import cycles
from dashboard.racks import RackRenderer
from dashboard.views import common
from inventory.models import NVLinkDomain
from inventory.reads import nvlink_report
from placement.what_if_reads import WhatIfRefused, what_if


def racks(only_pk: int | None = None) -> list[dict[str, Any]]:
    """Each domain of the NVLink report as {pk, rack, domain}; the unassigned trays last, as a rack of their own."""
    report = nvlink_report()
    pks = {d.key: d.pk for d in NVLinkDomain.objects.all()}
    out = []
    for domain in report["domains"]:
        pk = pks.get(domain["key"])
        if only_pk is not None and pk != only_pk:
            continue
        out.append(_entry(pk, domain))
    # In the order people name racks (their trays' names), not by ClusterUUID.
    out.sort(key=lambda e: e["rack"].name)
    if only_pk is None and report["unassigned"]:
        # Trays trying to join but naming no domain: "which rack is this" is the first question.
        out.append(_entry(None, {"key": "", "name": "trays in no domain", "nodes": report["unassigned"]}))
    return out


def _entry(pk: int | None, domain: dict[str, Any]) -> dict[str, Any]:
    rack = RackRenderer(domain).render()
    return {"pk": pk, "domain": domain, "rack": rack, "nodes": [n["node"] for n in domain["nodes"]]}


# The racks are drawn with the cycle collector held off (core.cycles): a page of 100 NVL72 racks
# builds some 100,000 small objects, none in a cycle, and the collector's passes over them were a
# sixth of its time.


def page(request: HttpRequest) -> HttpResponse:
    with cycles.uncollected():
        return common.page(
            request,
            "dashboard/nvlink.html",
            {"racks": racks()},
            title="NVLink domains",
            section="nvlink",
            socket="/ws/console/fleet/",
        ).render()


def racks_fragment(request: HttpRequest) -> HttpResponse:
    with cycles.uncollected():
        return common.fragment(request, "dashboard/fragments/racks.html", {"racks": racks()})


def _one(pk: int) -> dict[str, Any]:
    found = racks(only_pk=pk)
    if not found:
        raise Http404(f"no NVLink domain {pk}")
    return found[0]


def domain_page(request: HttpRequest, pk: int) -> HttpResponse:
    entry = _one(pk)
    return common.page(
        request,
        "dashboard/domain.html",
        {"entry": entry},
        title=f"NVLink domain {entry['rack'].name}",
        section="nvlink",
        socket=f"/ws/console/nvlink/{pk}/",
        crumbs=[("NVLink", reverse("admin:console-nvlink"))],
    )


def rack_fragment(request: HttpRequest, pk: int) -> HttpResponse:
    return common.fragment(request, "dashboard/fragments/rack.html", {"entry": _one(pk)})


# The answer is a whole scheduler run: asked again on a timer and when parts of the fleet come or go, not on
# every heartbeat's message.
WHAT_IF_REFRESH_S = 30


def _what_if(request: HttpRequest) -> dict[str, Any]:
    """The page's context: the API's answer for ``?lose=``, or the sentence refusing the question."""
    lose = request.GET.getlist("lose")
    try:
        answer, refused = what_if(lose), None
    except WhatIfRefused as exc:
        answer, refused = None, str(exc)
    for target in (answer or {}).get("lose", []):
        target["kind_words"] = target["kind"].replace("_", " ").replace("nvlink", "NVLink")
    return {
        "answer": answer,
        "refused": refused,
        "lose": lose,
        "query": request.GET.urlencode(),
        "refresh_s": WHAT_IF_REFRESH_S,
    }


def what_if_page(request: HttpRequest) -> TemplateResponse:
    """What losing the trays, racks or other parts in ``?lose=`` would do: the same answer as ``/api/v1/what-if``.

    Nothing is changed; a question that names nothing is answered 400 with the same sentence as the API's.
    """
    context = _what_if(request)
    lose = context["lose"]
    response = common.page(
        request,
        "dashboard/what_if.html",
        context,
        title=f"What if we lose {', '.join(lose)}" if lose else "What if",
        section="nvlink",
        socket="/ws/console/fleet/",
        crumbs=[("NVLink", reverse("admin:console-nvlink"))],
    )
    if context["refused"]:
        response.status_code = 400
    return response


def what_if_fragment(request: HttpRequest) -> HttpResponse:
    context = _what_if(request)
    response = common.fragment(request, "dashboard/fragments/what_if.html", context)
    if context["refused"]:
        response.status_code = 400
    return response
