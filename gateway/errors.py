"""Refusals on /v1, in OpenAI's error shape: ``{"error": {"message", "type", "code"}}``.

The official clients read ``message`` into the exception they raise, so each
one is a sentence that says what to fix.
"""

from __future__ import annotations

import json

from core.failover import DATABASE_RETRY_AFTER_S


class Refused(Exception):
    """A request the gateway answers with an error instead of an engine's answer."""

    def __init__(self, status: int, message: str, type_: str, code: str, retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.code = code
        self.retry_after_s = retry_after_s
        """Sent as ``Retry-After`` (seconds) when set: when the client should try again."""

    def body(self) -> bytes:
        return json.dumps({"error": {"message": self.message, "type": self.type, "code": self.code}}).encode()


def engine_message(data: bytes) -> str:
    """What an engine's refusal says: its error's ``message`` when it is a JSON object with one, else its
    first 500 bytes as text."""
    message = data[:500].decode(errors="replace")
    try:
        obj = json.loads(data)
    except ValueError:
        return message
    if isinstance(obj, dict):
        inner = obj.get("error") if isinstance(obj.get("error"), dict) else obj
        if isinstance(inner.get("message"), str):
            return inner["message"]
    return message


def bad_request(message: str, code: str = "invalid_request") -> Refused:
    return Refused(400, message, "invalid_request_error", code)


def unauthorized(message: str) -> Refused:
    return Refused(401, message, "authentication_error", "invalid_api_key")


def not_allowed(model: str) -> Refused:
    return Refused(
        403,
        f"this API key may not use model {model!r}: ask for a key that includes it",
        "permission_error",
        "model_not_allowed",
    )


def unknown_model(model: str) -> Refused:
    return Refused(
        404,
        f"no model named {model!r} is served here: GET /v1/models lists the ones this key may use",
        "invalid_request_error",
        "model_not_found",
    )


def not_found(path: str) -> Refused:
    return Refused(404, f"{path} is not an endpoint of this gateway", "invalid_request_error", "unknown_url")


def too_large(limit: int) -> Refused:
    return Refused(
        413,
        f"the request body is larger than this gateway takes ({limit} bytes, LLMGW_GATEWAY_MAX_BODY_BYTES)",
        "invalid_request_error",
        "request_too_large",
    )


def over_budget(sentence: str) -> Refused:
    return Refused(429, sentence, "insufficient_quota", "budget_exceeded")


def rate_limited(sentence: str) -> Refused:
    return Refused(429, sentence, "rate_limit_error", "rate_limit_exceeded")


def unavailable(message: str, code: str = "no_replica", retry_after_s: int | None = None) -> Refused:
    return Refused(503, message, "service_unavailable", code, retry_after_s)


def upstream_failed(message: str) -> Refused:
    return Refused(502, message, "upstream_error", "upstream_failed")


def database_unavailable(detail: str) -> Refused:
    return Refused(
        503,
        f"the gateway's database did not answer ({detail}); it may be failing over, and nothing was sent to an "
        f"engine: try again in {DATABASE_RETRY_AFTER_S} s",
        "service_unavailable",
        "database_unavailable",
    )
