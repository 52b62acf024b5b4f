"""Nodes: the table, and one node's page (cards and how they are wired, ports, shards, what is wrong)."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.core.exceptions import BadRequest
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse
from django.views.decorators.http import require_POST

from dashboard import present
from dashboard.actions import NodeStateError, set_node_state_from_console
from dashboard.views import common
from inventory.models import Node, NVLinkDomain
from placement.reads import node_detail, node_pages, replica_list

# The verbs offered on the page: what each does, in the words on its button.
ACTIONS = (
    ("cordon", "Cordon", "takes nothing new"),
    ("drain", "Drain", "moves its replicas off, replacement first"),
    ("uncordon", "Uncordon", "back to ready"),
)


# Nodes a page of the table shows: a fleet of ten thousand is forty pages, each read and drawn
# on its own (the table's rows are most of the page's time).
PAGE = 250


def index_context(after: str | None = None) -> dict[str, Any]:
    """One page of the table: the first PAGE nodes by name after ``after`` (from the start when None)."""
    page = next(node_pages(size=PAGE, after=after or None), [])
    return {"nodes": page, "after": after or "", "next_after": page[-1]["id"] if len(page) == PAGE else ""}


def _after(request: HttpRequest) -> str | None:
    after = request.GET.get("after")
    if after and "\x00" in after:
        raise BadRequest("after: a node's name holds no NUL character")
    return after


def index(request: HttpRequest) -> HttpResponse:
    context = index_context(_after(request))
    return common.page(
        request, "dashboard/nodes.html", context, title="Nodes", section="nodes", socket="/ws/console/fleet/"
    )


def index_fragment(request: HttpRequest) -> HttpResponse:
    return common.fragment(request, "dashboard/fragments/nodes.html", index_context(_after(request)))


def node_context(name: str) -> dict[str, Any]:
    detail = node_detail(name)
    if detail is None:
        raise Http404(f"no node named {name!r}")
    node = Node.objects.only("pk", "engines").get(name=name)
    domain = _domain(detail.get("nvlink_domain"))
    return {
        "node": detail,
        "pk": node.pk,
        "engine_installs": _engines(node.engines),
        "matrix": present.nvlink_matrix(detail["gpus"]),
        "mig": present.mig_cards(detail["gpus"]),
        "cards": [g for g in detail["gpus"] if "parent" not in g],
        "shards": _shards(name),
        "domain_pk": domain.pk if domain else None,
        "actions": ACTIONS,
    }


def page(request: HttpRequest, name: str) -> HttpResponse:
    context = node_context(name)
    return common.page(
        request,
        "dashboard/node.html",
        context,
        title=f"Node {name}",
        section="nodes",
        socket=f"/ws/console/nodes/{context['pk']}/",
        crumbs=[("Nodes", reverse("admin:console-nodes"))],
    )


def fragment(request: HttpRequest, name: str) -> HttpResponse:
    return common.fragment(request, "dashboard/fragments/node.html", node_context(name))


@require_POST
def set_state(request: HttpRequest, name: str) -> HttpResponse:
    """The page's cordon / uncordon / drain buttons (a form POST with the admin's CSRF token)."""
    try:
        previous, state = set_node_state_from_console(
            name, request.POST.get("state", ""), actor=request.user.get_username()
        )
    except NodeStateError as refused:
        if refused.status == 404:
            raise Http404(refused.message) from None
        messages.error(request, refused.message)
    else:
        if previous == state:
            messages.info(request, f"{name} was already {state}.")
        else:
            messages.success(request, f"{name}: {previous} → {state}.")
    return HttpResponseRedirect(reverse("admin:console-node", args=[name]))


def _domain(key: str | None) -> NVLinkDomain | None:
    if not key or "/" not in key:
        return None
    uuid, _, clique = key.rpartition("/")
    return NVLinkDomain.objects.filter(cluster_uuid=uuid, clique_id=clique).first() if clique.isdigit() else None


def _engines(engines: Any) -> list[tuple[str, str]] | None:
    """Engine → installed version, as the agent reported it; None when it did not say (unknown, not none).

    ``node_detail`` lists the engines' names only; the page also shows what
    is installed, which the node row holds.
    """
    if not isinstance(engines, dict):
        return None
    return sorted((str(k), str(v)) for k, v in engines.items())


def _shards(name: str) -> list[dict[str, Any]]:
    """The shards on this node with their replica and download, from the same replica list the API serves."""
    out = []
    for r in replica_list():
        for s in r["shards"]:
            if s["node"] == name:
                out.append({**s, "replica": r["id"], "model": r["model"], "replica_state": r["state"]})
    return out
