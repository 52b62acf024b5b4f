"""What every console page shares: the admin's frame, the live socket, the fragment it re-fetches."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.template.response import TemplateResponse
from django.utils import timezone

SECTIONS = (
    ("fleet", "Fleet", "admin:console-fleet"),
    ("nodes", "Nodes", "admin:console-nodes"),
    ("nvlink", "NVLink", "admin:console-nvlink"),
    ("fabrics", "Fabrics", "admin:console-fabrics"),
    ("models", "Models", "admin:console-models"),
)


def page(
    request: HttpRequest,
    template: str,
    context: dict[str, Any],
    *,
    title: str,
    section: str,
    socket: str,
    crumbs: list[tuple[str, str]] | None = None,
) -> TemplateResponse:
    """A whole console page inside the admin: its header, user tools and sidebar, plus the live badge."""
    return TemplateResponse(
        request,
        template,
        {
            **admin.site.each_context(request),
            "title": title,
            "console_sections": SECTIONS,
            "console_section": section,
            "live_socket": socket,
            "crumbs": crumbs or [],
            "rendered_at": timezone.now(),
            **context,
        },
    )


def fragment(request: HttpRequest, template: str, context: dict[str, Any]) -> HttpResponse:
    """The live part of a page alone, for the page to swap in after an update."""
    return render(request, template, {"rendered_at": timezone.now(), **context})
