"""Error answers for the API: always ``{"error": "<sentence>"}``.

``ctl`` prints the server's sentence as it is, so every refusal says what to
fix rather than echoing a framework's field dictionary.
"""

from __future__ import annotations

from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler


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
