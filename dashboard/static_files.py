"""Static files (the admin's CSS, the console's CSS and script) served by the admin listener itself.

``llmgw serve`` runs with DEBUG off and no collectstatic step and no web
server in front, so nothing else serves /static/: without this the admin
loses its look and the console its lights. The files are found where the
apps keep them (the staticfiles finders), which is what collectstatic would
have copied; they are few and small, and browsers cache them by
Last-Modified.
"""

from __future__ import annotations

from django.contrib.staticfiles.views import serve
from django.core.exceptions import SuspiciousFileOperation
from django.http import Http404, HttpRequest, HttpResponse


def static_file(request: HttpRequest, path: str) -> HttpResponse:
    # insecure=True only lifts the DEBUG check; the finders still refuse any
    # path outside the apps' static folders.
    try:
        return serve(request, path, insecure=True)
    except SuspiciousFileOperation:
        raise Http404("no such file") from None
