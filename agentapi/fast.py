"""The heartbeat's fast lane: ``POST /api/v1/agent/heartbeat`` answered before Django is reached.

This is the only place the path is served (every server runs ``llmgw.asgi``,
and the tests post through it too). Only the HTTP is here: headers, body
limits, responses. Whether a beat can be taken and what it is answered are
inventory's (inventory/writes/heartbeats.py): the credential's node, the queue the
flusher writes, the shard table. Answering here, in the event loop, skips
Django's middleware and its hop to a worker thread, which is most of a
heartbeat's cost. Unchanged full reports are answered here too; the rest go
on to the Django view, which refuses in the same words (``limits.py``).
"""

from __future__ import annotations

from typing import Any

from asgiref.sync import sync_to_async

from agentapi.limits import HEARTBEAT_LIMIT, REPORT_LIMIT, REVOKED, SEND_BEARER, USE_POST, too_large
from core import dbpool, jsonbody, jsontext
from core.credentials import bearer_secret
from core.errors import DATABASE_DOWN, DATABASE_RETRY_AFTER_S, first_line
from inventory.writes import heartbeats
from inventory.writes.heartbeats import desk

PATH = "/api/v1/agent/heartbeat"
REPORT_PATH = "/api/v1/agent/report"


def wants(scope) -> bool:
    """The heartbeat's path, whatever the method: another method is refused here, not by a Django 404."""
    return scope["type"] == "http" and scope["path"] == PATH


def wants_report(scope) -> bool:
    return scope["type"] == "http" and scope["path"] == REPORT_PATH and scope["method"] == "POST"


async def respond(send, status: int, body: dict, headers: tuple[tuple[bytes, bytes], ...] = ()) -> None:
    data = jsontext.compact(body)  # a body a beat: orjson's time, not json's
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(data)).encode()),
                *headers,
            ],
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


def _lookup(secret: str) -> heartbeats.NodeRef | None:
    """The desk's database lookup, on a thread of the loop's executor that lives on.

    Such a thread sends no request_finished, so it hands its connection back
    itself; in an admin process that pools (core.dbpool) it would otherwise
    hold a place in the pool for as long as the process lives.
    """
    try:
        return desk.lookup(secret)
    finally:
        dbpool.give_back()


def checked_beat(body: bytes) -> tuple[Any, str | None]:
    """(the heartbeat in ``body``, None), or (None, why it is refused: a 400's words).

    Both servers of the lane judge a body here: :func:`heartbeat` below, and
    the admin listener's protocol, which answers a known node's beat inside
    uvicorn's parser (llmgw.admin_protocol).
    """
    try:
        beat = jsonbody.loads(body or b"null")
    except jsonbody.BodyError as exc:
        return None, str(exc)
    refused = heartbeats.refusal(beat)
    return (None, refused) if refused else (beat, None)


async def heartbeat(scope, receive, send) -> None:
    if scope["method"] != "POST":
        return await respond(send, 405, {"error": USE_POST}, ((b"allow", b"POST"),))
    length = header(scope, b"content-length")
    if length.isdigit() and int(length) > HEARTBEAT_LIMIT:
        return await respond(send, 413, {"error": too_large(int(length), HEARTBEAT_LIMIT)})
    secret = bearer_secret(header(scope, b"authorization"))
    if secret is None:
        return await respond(send, 401, {"error": SEND_BEARER})
    body = await read_body(receive, HEARTBEAT_LIMIT)
    if body is None:
        return await respond(send, 413, {"error": too_large(None, HEARTBEAT_LIMIT)})
    # The body is judged before the credential is looked up: a bad beat is told so whoever sent it.
    beat, refused = checked_beat(body)
    if refused:
        return await respond(send, 400, {"error": refused})
    ref = desk.cached(secret)
    if ref is None:
        try:
            ref = await sync_to_async(_lookup, thread_sensitive=False)(secret)
        except DATABASE_DOWN as exc:
            # A credential this server has not seen yet, while the database is away: the agent is told
            # when to try again (as every other view says it), and keeps its report for later.
            return await respond(
                send,
                503,
                {
                    "error": f"the database did not answer ({first_line(exc)}); it may be failing over: "
                    f"try again in {DATABASE_RETRY_AFTER_S} s"
                },
                ((b"retry-after", str(DATABASE_RETRY_AFTER_S).encode()),),
            )
    if ref is None:
        return await respond(send, 401, {"error": REVOKED})
    return await respond(send, 200, heartbeats.take(ref, beat))


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


async def _known(scope) -> heartbeats.NodeRef | None:
    """The report's node as the desk knows it, looked up when not cached; None: the view is to decide.

    Looked up as a heartbeat's credential is: a process that did not register
    the node (one of several admin processes, or one restarted) meets it
    first by a report as often as by a beat, and the lookup costs a tenth of
    the view's taking an unchanged report. An unknown credential or a
    database that does not answer is the view's to answer, in its words.
    """
    secret = bearer_secret(header(scope, b"authorization"))
    if secret is None:
        return None
    ref = desk.cached(secret)
    if ref is None:
        try:
            ref = await sync_to_async(_lookup, thread_sensitive=False)(secret)
        except DATABASE_DOWN:
            return None
    return ref


async def report(scope, receive, send, app) -> None:
    """An unchanged full report is answered here; anything else goes on to the Django view.

    Only the common case is taken (:func:`inventory.writes.heartbeats.take_unchanged_report`
    says which): a valid report from a known node whose digest matches the one
    stored. A changed report, a refusal, anything in doubt is handed to the
    view with its body, which then answers exactly as it always does.
    """
    length = header(scope, b"content-length")
    if length.isdigit() and int(length) > REPORT_LIMIT:
        return await app(scope, receive, send)
    body = await read_body(receive, REPORT_LIMIT)
    if body is None:
        return await respond(send, 413, {"error": too_large(None, REPORT_LIMIT)})
    ref = await _known(scope)
    if ref is not None and ref.report_digest:
        try:
            parsed = jsonbody.loads(body or b"null")
        except jsonbody.BodyError:
            parsed = None  # the view refuses it, in the same words
        answer = heartbeats.take_unchanged_report(ref, parsed)
        if answer is not None:
            return await respond(send, 200, answer)
    return await app(scope, replaying(body, receive), send)
