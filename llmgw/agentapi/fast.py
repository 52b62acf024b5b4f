"""The heartbeat's fast lane: ``POST /api/v1/agent/heartbeat`` answered before Django is reached.

Everything a heartbeat needs is in the desk (see desk.py): the credential's
node, the queue the flusher writes, the shard table. Answering here, in the
event loop, skips Django's middleware and its hop to a worker thread, which is
most of a heartbeat's cost. The refusals are the same as the Django view's,
word for word: both call the same checks.
"""

from __future__ import annotations

import json

from asgiref.sync import sync_to_async

from inventory.report_schema import heartbeat_problems
from llmgw.agentapi import desk as desk_module
from llmgw.agentapi.desk import desk
from llmgw.agentapi.limits import HEARTBEAT_LIMIT, REVOKED, SEND_BEARER, too_large

PATH = "/api/v1/agent/heartbeat"


def wants(scope) -> bool:
    return scope["type"] == "http" and scope["path"] == PATH and scope["method"] == "POST"


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
        beat = json.loads(body or b"null")
    except (ValueError, UnicodeDecodeError) as exc:
        return await respond(send, 400, {"error": f"the body is not valid JSON: {exc}"})
    problems = heartbeat_problems(beat)
    if problems:
        return await respond(send, 400, {"error": "the heartbeat was not stored: " + "; ".join(problems)})
    secret = secret.strip()
    ref = desk.cached(secret) or await sync_to_async(desk.lookup, thread_sensitive=False)(secret)
    if ref is None:
        return await respond(send, 401, {"error": REVOKED})
    desk_module.ensure_flusher()
    return await respond(send, 200, desk.accept(ref, beat, desk_module.now()))
