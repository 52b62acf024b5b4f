"""The heartbeat's fast lane: ``POST /api/v1/agent/heartbeat`` answered before Django is reached.

Everything a heartbeat needs is in the desk (see inventory/heartbeats.py): the credential's
node, the queue the flusher writes, the shard table. Answering here, in the
event loop, skips Django's middleware and its hop to a worker thread, which is
most of a heartbeat's cost. The refusals are the same as the Django view's,
word for word: both call the same checks.
"""

from __future__ import annotations

import json

from asgiref.sync import sync_to_async

from agent.protocol import report_digest
from agentapi.limits import HEARTBEAT_LIMIT, REPORT_LIMIT, REVOKED, SEND_BEARER, too_large
from core import jsonbody
from inventory import heartbeats as desk_module
from inventory.bounds import report_bounds
from inventory.heartbeats import desk
from inventory.report_schema import heartbeat_problems, report_problems

PATH = "/api/v1/agent/heartbeat"
REPORT_PATH = "/api/v1/agent/report"


def wants(scope) -> bool:
    return scope["type"] == "http" and scope["path"] == PATH and scope["method"] == "POST"


def wants_report(scope) -> bool:
    return scope["type"] == "http" and scope["path"] == REPORT_PATH and scope["method"] == "POST"


async def respond(send, status: int, body: dict) -> None:
    data = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": data})


def header(scope, name: bytes) -> str:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return value.decode("latin-1")
    return ""


async def read_body(receive, limit: int) -> bytes | None:
    """The body, or None once it grows past ``limit`` (the rest is not kept)."""
    chunks, size, more = [], 0, True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            return b""
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        more = message.get("more_body", False)
    return b"".join(chunks)


async def heartbeat(scope, receive, send) -> None:
    length = header(scope, b"content-length")
    if length.isdigit() and int(length) > HEARTBEAT_LIMIT:
        return await respond(send, 413, {"error": too_large(int(length), HEARTBEAT_LIMIT)})
    scheme, _, secret = header(scope, b"authorization").partition(" ")
    if scheme.lower() != "bearer" or not secret.strip():
        return await respond(send, 401, {"error": SEND_BEARER})
    body = await read_body(receive, HEARTBEAT_LIMIT)
    if body is None:
        return await respond(send, 413, {"error": too_large(None, HEARTBEAT_LIMIT)})
    try:
        beat = jsonbody.loads(body or b"null")
    except jsonbody.BodyError as exc:
        return await respond(send, 400, {"error": str(exc)})
    problems = heartbeat_problems(beat)
    if problems:
        return await respond(send, 400, {"error": "the heartbeat was not stored: " + "; ".join(problems)})
    secret = secret.strip()
    ref = desk.cached(secret) or await sync_to_async(desk.lookup, thread_sensitive=False)(secret)
    if ref is None:
        return await respond(send, 401, {"error": REVOKED})
    desk_module.ensure_flusher()
    return await respond(send, 200, desk.accept(ref, beat, desk_module.now()))


def replaying(body: bytes, receive):
    """A ``receive`` that hands the already-read body to the next app, then carries on as the original."""
    sent = False

    async def replay():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def report(scope, receive, send, app) -> None:
    """An unchanged full report is answered here; anything else goes on to the Django view.

    Only the common case is taken: a valid report from a known node whose
    digest matches the one stored. A changed report, a refusal, anything in
    doubt is handed to the view with its body, which then answers exactly as
    it always does.
    """
    length = header(scope, b"content-length")
    if length.isdigit() and int(length) > REPORT_LIMIT:
        return await app(scope, receive, send)
    body = await read_body(receive, REPORT_LIMIT)
    if body is None:
        return await respond(send, 413, {"error": too_large(None, REPORT_LIMIT)})
    scheme, _, secret = header(scope, b"authorization").partition(" ")
    ref = desk.cached(secret.strip()) if scheme.lower() == "bearer" and secret.strip() else None
    if ref is not None and ref.report_digest:
        try:
            parsed = jsonbody.loads(body or b"null")
        except jsonbody.BodyError:
            parsed = None  # the view refuses it, in the same words
        if (
            isinstance(parsed, dict)
            and not report_problems(parsed, report_bounds())
            and report_digest(parsed) == ref.report_digest
        ):
            desk_module.ensure_flusher()
            return await respond(send, 200, desk.accept_unchanged_report(ref, parsed, desk_module.now()))
    return await app(scope, replaying(body, receive), send)
