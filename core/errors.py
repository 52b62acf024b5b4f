"""Error answers for the API: always ``{"error": "<sentence>"}``.

``ctl`` prints the server's sentence as it is, so every refusal says what to
fix rather than echoing a framework's field dictionary.
"""

from __future__ import annotations

import logging

import psycopg
from django import db
from django.http import JsonResponse
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from core.failover import DATABASE_RETRY_AFTER_S

log = logging.getLogger("llmgw.database")


def _sentence(detail) -> str:
    if isinstance(detail, dict):
        parts = []
        for field, value in detail.items():
            text = _sentence(value)
            parts.append(text if field == "non_field_errors" else f"{field}: {text}")
        return "; ".join(parts)
    if isinstance(detail, list):
        return " ".join(_sentence(v) for v in detail)
    return str(detail)


def exception_handler(exc, context):
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    return Response(
        {
            "error": _sentence(
                response.data.get("detail", response.data) if isinstance(response.data, dict) else response.data
            )
        },
        status=response.status_code,
        headers={k: v for k, v in response.items()},
    )


# The database cannot be reached: Django's wrappers and psycopg's own (the gateway's async connections).
DATABASE_DOWN = (psycopg.OperationalError, psycopg.InterfaceError, db.OperationalError, db.InterfaceError)


def first_line(exc: BaseException) -> str:
    """An exception's first line, or its class's name when it has none."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class DatabaseDownMiddleware:
    """The admin listener's answer when the database does not answer: 503 with a sentence, not a 500.

    Any view (the API, the agents' registration and reports, the console)
    may be in the middle of a switchover or failover; what it would have
    done is not done, and the client is told to try again in
    DATABASE_RETRY_AFTER_S seconds. A session that the failover closed is
    not reused: Django closes a connection that failed (conn_health_checks
    in llmgw.settings) and opens a new one, through HAProxy, to the leader.
    """

    def __init__(self, get_response) -> None:
        self.get_response = get_response

    def __call__(self, request):
        return self.get_response(request)

    def process_exception(self, request, exc: Exception):
        if not isinstance(exc, DATABASE_DOWN):
            return None
        log.warning("%s %s: the database did not answer: %s", request.method, request.path, first_line(exc))
        sentence = (
            f"the database did not answer ({first_line(exc)}); it may be failing over, and nothing was changed: "
            f"try again in {DATABASE_RETRY_AFTER_S} s"
        )
        return JsonResponse({"error": sentence}, status=503, headers={"Retry-After": str(DATABASE_RETRY_AFTER_S)})
