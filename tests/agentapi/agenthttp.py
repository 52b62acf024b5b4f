"""Speaking the agent protocol (Django's test client, or the ASGI application), and showing what a request changed."""

from __future__ import annotations

import asyncio
import json
from io import StringIO
from typing import Any

import httpx
from django.core.management import call_command

from inventory.writes.heartbeats import desk
from llmgw.asgi import application

HEARTBEAT = "/api/v1/agent/heartbeat"


def post(client, path, body, token, raw: bytes | None = None):
    data = raw if raw is not None else json.dumps(body)
    return client.post(
        f"/api/v1/agent/{path}", data=data, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}"
    )


def asgi(path: str, token: str, body: Any = None, *, raw: bytes | None = None, method: str = "POST") -> httpx.Response:
    """One request through the ASGI application ``llmgw serve`` runs, its fast lanes included."""
    content = raw if raw is not None else json.dumps(body).encode()

    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=application)
        async with httpx.AsyncClient(transport=transport, base_url="http://control") as http:
            headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
            return await http.request(method, path, content=content, headers=headers)

    return asyncio.run(go())


def flush() -> None:
    """What the flusher thread does each interval, done here by hand: write the queued beats, reload the tables."""
    desk.flush()
    desk.refresh_shards()


def heartbeat(token: str, body: Any = None, *, raw: bytes | None = None) -> httpx.Response:
    """A heartbeat as production takes it: through the fast lane, then written by a flush.

    Before it, the desk's tables are reloaded, as the flusher leaves them each
    second, so the answer hands out what is stored now; and the credential is
    looked up from this thread, as a desk that took the node's registration
    already knows it: the lane then answers from memory, as in production, and
    a test inside a transaction no other thread sees still works.
    """
    desk.lookup(token)
    desk.refresh_shards()
    answer = asgi(HEARTBEAT, token, body, raw=raw)
    flush()
    return answer


def register(client, join, name="tray-01", machine_id="m-1", **extra):
    return post(client, "register", {"name": name, "machine_id": machine_id, **extra}, join)


def snapshot() -> str:
    """Every inventory row, as text, to show a refusal changed nothing.

    Except a node's ``report_error``: a refused report's one trace is why it
    was refused (tested: test_unstorable.py::test_a_refused_report_is_kept_on_the_node...).
    """
    out = StringIO()
    call_command("dumpdata", "inventory", stdout=out)
    rows = json.loads(out.getvalue())
    for row in rows:
        if row["model"] == "inventory.node":
            row["fields"].pop("report_error", None)
    return json.dumps(rows, sort_keys=True)
