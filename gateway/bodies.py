"""Request and answer bodies on their way through the gateway: parsed, rewritten for the engine, translated back."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from core import jsonbody
from gateway import (
    anthropic,
    errors,
    fields,
    responses,
    shapes,
    tokens,
)
from gateway.directory import ReplicaEntry

if TYPE_CHECKING:
    from gateway.proxy import Ticket


def parse_body(raw: bytes, endpoint: str) -> dict:
    try:
        # Unicode only: a lone surrogate could be neither forwarded, nor logged, nor stored (a 500 before).
        body = jsonbody.loads(raw, unicode_only=True)
    except jsonbody.BodyError as exc:
        raise errors.bad_request(str(exc), "invalid_json") from None
    if not isinstance(body, dict):
        raise errors.bad_request("the request body must be a JSON object", "invalid_json")
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise errors.bad_request("the request names no model: send {'model': 'NAME', …}", "model_missing")
    # Before anything is reserved: a body no engine would serve costs nothing (gateway/shapes.py).
    wrong = shapes.problem(endpoint, body) or fields.adapter_problem(body)
    if wrong:
        raise errors.bad_request(wrong, "invalid_request")
    return body


def upstream_body(body: dict, model: str, ticket: Ticket, engine: str) -> bytes:
    """The body for an engine of kind ``engine``: the fields it may be sent (gateway.fields), one length
    bound (``tokens.bounded``), the model's own name, and usage asked for on streams. ``body`` is a chat
    request where the client spoke a protocol served as chat (``AS_CHAT``)."""
    endpoint = "chat/completions" if ticket.original is not None else ticket.endpoint
    out = tokens.bounded(fields.forwarded(body, endpoint, engine), endpoint, ticket.per_choice)
    out["model"] = model
    if ticket.stream and endpoint != "embeddings":
        given = out.get("stream_options")
        options = dict(given) if isinstance(given, dict) else {}
        if not options.get("include_usage"):
            options["include_usage"] = True
            out["stream_options"] = options
    return json.dumps(out).encode()


def upstream_path(ticket: Ticket, replica: ReplicaEntry) -> str:
    """The engine endpoint this request goes to on ``replica``: Messages natively where it serves them."""
    if ticket.original is None:
        return ticket.endpoint
    return ticket.endpoint if ticket.endpoint in replica.native else "chat/completions"


def as_message(status: int, data: bytes, model: str, stops: list[str]) -> bytes:
    """A chat answer (or an engine's refusal) as Anthropic's Message (or error)."""
    if status >= 400:
        return anthropic.engine_error(status, data)
    answer = _json_object(data)
    if answer is None:
        return anthropic.error_body(502, "the engine's answer was not a JSON object")
    return json.dumps(anthropic.from_chat(answer, model, stops)).encode()


def as_response(status: int, data: bytes, model: str, request: dict) -> bytes:
    """A chat answer as a Response; an engine's refusal stays in OpenAI's shape, which Responses shares."""
    if status >= 400:
        return data
    answer = _json_object(data)
    if answer is None:
        return errors.upstream_failed("the engine's answer was not a JSON object").body()
    return json.dumps(responses.from_chat(answer, model, request)).encode()


def usage_of_message(data: bytes) -> tuple[tuple[int, int] | None, str]:
    """Usage and text of an engine's own Message."""
    obj = _json_object(data)
    if obj is None:
        return None, ""
    blocks = obj.get("content") if isinstance(obj.get("content"), list) else []
    text = "".join(b["text"] for b in blocks if isinstance(b, dict) and isinstance(b.get("text"), str))
    return anthropic.usage_of(obj), text


def usage_of_body(data: bytes) -> tuple[tuple[int, int] | None, str]:
    obj = _json_object(data)
    if obj is None:
        return None, ""
    text = ""
    for choice in obj.get("choices") or []:
        if isinstance(choice, dict):
            message = choice.get("message")
            text += (message.get("content") or "") if isinstance(message, dict) else (choice.get("text") or "")
    return tokens.usage_of(obj), text


def _json_object(data: bytes) -> dict | None:
    """An engine's answer read as a JSON object; None when it is not valid JSON or not an object."""
    try:
        value = json.loads(data)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
