"""Hooking the console into the Django admin: its URLs under /admin/, and links from the admin's index.

The admin's own ``get_urls`` ends in catch-alls (an app's index, then a
"not found" view), so the console's patterns go first. Every page goes
through ``site.admin_view``: only an active staff user gets in, anyone else
is sent to the admin's login and comes back after it; then through
:func:`through_door`, which asks core.access for the page's permissions.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from django.contrib.admin import AdminSite
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.urls import path

from core import access
from dashboard.views import fabrics, fleet, models, nodes, nvlink

INDEX_TEMPLATE = "dashboard/admin_index.html"


def through_door(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """``view``, opened only to an account holding what core.access names for its URL and method (else 403)."""

    @functools.wraps(view)
    def checked(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        name = request.resolver_match.url_name
        # A method a known page does not take is no door: the view's own decorator answers 405.
        # A page the table does not know stays shut (refusal: superusers only).
        known = access.needs(name, request.method) is not None or not access.methods_of(name)
        door = name if known else None
        if why := access.refusal(request.user, door, request.method):
            raise PermissionDenied(why)
        return view(request, *args, **kwargs)

    return checked


def console_urls(site: AdminSite) -> list:
    def v(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
        return site.admin_view(through_door(view))

    return [
        path("fleet/", v(fleet.page), name="console-fleet"),
        path("fleet/live", v(fleet.fragment), name="console-fleet-live"),
        path("nodes/", v(nodes.index), name="console-nodes"),
        path("nodes/live", v(nodes.index_fragment), name="console-nodes-live"),
        path("nodes/<str:name>/", v(nodes.page), name="console-node"),
        path("nodes/<str:name>/live", v(nodes.fragment), name="console-node-live"),
        path("nodes/<str:name>/state", v(nodes.set_state), name="console-node-state"),
        path("nvlink/", v(nvlink.page), name="console-nvlink"),
        path("nvlink/live", v(nvlink.racks_fragment), name="console-nvlink-live"),
        path("nvlink/what-if/", v(nvlink.what_if_page), name="console-what-if"),
        path("nvlink/what-if/live", v(nvlink.what_if_fragment), name="console-what-if-live"),
        path("nvlink/<int:pk>/", v(nvlink.domain_page), name="console-domain"),
        path("nvlink/<int:pk>/live", v(nvlink.rack_fragment), name="console-domain-live"),
        path("fabrics/", v(fabrics.page), name="console-fabrics"),
        path("fabrics/live", v(fabrics.fragment), name="console-fabrics-live"),
        path("fabrics/<str:fabric>/", v(fabrics.topology_page), name="console-fabric"),
        path("fabrics/<str:fabric>/live", v(fabrics.topology_fragment), name="console-fabric-live"),
        path("models/", v(models.page), name="console-models"),
        path("models/live", v(models.fragment), name="console-models-live"),
        path("models/<str:name>/", v(models.model_page), name="console-model"),
        path("models/<str:name>/live", v(models.model_fragment), name="console-model-live"),
    ]


def install(site: AdminSite) -> None:
    """Put the console's pages in front of the site's URLs and its links on the site's index."""
    if getattr(site, "_console_installed", False):
        return
    original = site.get_urls

    def get_urls() -> list:
        return console_urls(site) + original()

    site.get_urls = get_urls
    site.index_template = INDEX_TEMPLATE
    site._console_installed = True
