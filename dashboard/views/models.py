"""Models and their replicas: desired against ready, profiles, the scheduler's last word, shards and where."""

from __future__ import annotations

from typing import Any

from django.http import Http404, HttpRequest, HttpResponse
from django.urls import reverse

from catalog.models import CatalogModel
from dashboard.views import common
from placement.reads import explain, model_list, replica_list

SOCKET = "/ws/console/fleet/"
# Placement publishes nothing live yet, and shard progress arrives in light
# heartbeats, which are not published either: these pages also re-fetch on
# this period while their socket is open.
REFRESH_S = 10


def _with_replicas(models: list[dict[str, Any]], replicas: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by_model: dict[str, list[dict[str, Any]]] = {}
    for r in replicas:
        by_model.setdefault(r["model"], []).append(r)
    return [{**m, "replicas": by_model.get(m["name"], [])} for m in models]


def context() -> dict[str, Any]:
    models = _with_replicas(model_list(), replica_list())
    return {"models": models, "nodes": sorted({s["node"] for m in models for r in m["replicas"] for s in r["shards"]})}


def page(request: HttpRequest) -> HttpResponse:
    return common.page(
        request,
        "dashboard/models.html",
        {**context(), "refresh_s": REFRESH_S},
        title="Models and replicas",
        section="models",
        socket=SOCKET,
    )


def fragment(request: HttpRequest) -> HttpResponse:
    return common.fragment(request, "dashboard/fragments/models.html", {**context(), "refresh_s": REFRESH_S})


def model_context(name: str) -> dict[str, Any]:
    found = model_list(name)
    model = CatalogModel.objects.filter(name=name).first()
    if not found or model is None:
        raise Http404(f"no model named {name!r}")
    entry = _with_replicas(found, replica_list(model=name))[0]
    return {"model": entry, "explanation": explain(model), "pk": model.pk, "refresh_s": REFRESH_S}


def model_page(request: HttpRequest, name: str) -> HttpResponse:
    return common.page(
        request,
        "dashboard/model.html",
        model_context(name),
        title=f"Model {name}",
        section="models",
        socket=SOCKET,
        crumbs=[("Models", reverse("admin:console-models"))],
    )


def model_fragment(request: HttpRequest, name: str) -> HttpResponse:
    return common.fragment(request, "dashboard/fragments/model.html", model_context(name))
