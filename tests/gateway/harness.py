"""Driving the gateway's ASGI app in-process, the way an ASGI server would, with fake engines.

Tests write their rows first (the ORM cannot be used from inside the event
loop), then run a scenario with ``asyncio.run``, then read what was recorded.
The gateway's own threads see the rows because these tests commit
(``transaction=True``).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from catalog.models import Alias, CatalogModel, Fallback, Profile
from gateway import conf
from gateway.asgi import GatewayApp
from gateway.models import Price
from gateway.proxy import Gateway
from gateway.writes import keys
from placement.models import Replica, ReplicaState

FAST = replace(
    conf.load({}),
    refresh_s=0.05,
    flush_every_s=0.01,
    touch_every_s=0.05,
    cold_start_timeout_s=3.0,
    db_threads=2,
    upstream_connect_timeout_s=1.0,
)


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    chunks: list[tuple[float, bytes]] = field(default_factory=list)
    """Each body part with the time (seconds since the request) it was sent."""

    @property
    def body(self) -> bytes:
        return b"".join(c for _, c in self.chunks)

    def json(self):
        return json.loads(self.body)

    def events(self) -> list:
        out = []
        for line in self.body.decode().splitlines():
            if line.startswith("data: ") and line != "data: [DONE]":
                out.append(json.loads(line[6:]))
        return out


async def call(
    app: GatewayApp,
    path: str,
    body: dict | bytes | None = None,
    *,
    key: str | None = None,
    method: str = "POST",
    disconnect_after_chunks: int | None = None,
    headers: dict[str, str] | None = None,
    on_body: Callable[[bytes], None] | None = None,
) -> Answer:
    """One request through the app; with ``disconnect_after_chunks`` the client hangs up after that many.

    ``on_body`` is given each body part as it is sent (a lockstep engine's ``saw``).
    """
    raw = body if isinstance(body, bytes) else json.dumps(body or {}).encode()
    head = [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]
    if key:
        head.append((b"authorization", f"Bearer {key}".encode()))
    head += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    scope = {"type": "http", "method": method, "path": path, "headers": head, "query_string": b""}
    incoming: asyncio.Queue = asyncio.Queue()
    incoming.put_nowait({"type": "http.request", "body": raw, "more_body": False})
    answer = Answer(0, {})
    started = time.monotonic()
    bodies = 0

    async def receive():
        return await incoming.get()

    async def send(message):
        nonlocal bodies
        if message["type"] == "http.response.start":
            answer.status = message["status"]
            answer.headers = {k.decode(): v.decode() for k, v in message["headers"]}
        elif message["type"] == "http.response.body" and message.get("body"):
            answer.chunks.append((time.monotonic() - started, message["body"]))
            if on_body is not None:
                on_body(message["body"])
            bodies += 1
            if disconnect_after_chunks is not None and bodies >= disconnect_after_chunks:
                incoming.put_nowait({"type": "http.disconnect"})

    await app(scope, receive, send)
    return answer


async def settle(app: GatewayApp) -> None:
    """Let the app write what it queued, and close it (its threads' connections too)."""
    if app.gateway is not None:
        await app.gateway.close()


def new_app(settings=FAST) -> GatewayApp:
    return GatewayApp(lambda: Gateway(settings))


def app_on(redis=None, settings=FAST) -> GatewayApp:
    """An app whose rate limits ``redis`` counts (a ``redis.asyncio`` client), else the database does."""
    return GatewayApp(lambda: Gateway(settings, redis))


def at_once(app_factory: Callable[[], GatewayApp], path: str, body: dict, secret: str, clients: int) -> list[Answer]:
    """``clients`` requests sent together through one app made by ``app_factory``; their answers once the app
    has written what it holds."""

    async def scenario():
        app = app_factory()
        try:
            return await asyncio.gather(*(call(app, path, body, key=secret) for _ in range(clients)))
        finally:
            await settle(app)

    return asyncio.run(scenario())


def model(name: str, *, min_replicas: int = 1, aliases=(), price: tuple[int, int] | None = None) -> CatalogModel:
    m = CatalogModel.objects.create(name=name, min_replicas=min_replicas, max_replicas=max(1, min_replicas))
    for alias in aliases:
        Alias.objects.create(model=m, name=alias)
    if price:
        Price.objects.create(model=m, prompt_micros_per_million=price[0], completion_micros_per_million=price[1])
    return m


def replica(m: CatalogModel, endpoint: str, state: str = ReplicaState.READY, engine: str | None = None) -> Replica:
    """A replica at ``endpoint``; with ``engine``, placed under a profile of that engine (which decides what
    the gateway asks it natively, e.g. ``/v1/messages`` of vllm and llamacpp)."""
    profile = None
    if engine:
        defaults = {"engine": engine, "gpu_class": "cpu", "memory_gb": 1}
        profile, _ = Profile.objects.get_or_create(model=m, name=f"fake-{engine}", defaults=defaults)
    return Replica.objects.create(model=m, profile=profile, profile_name="fake", state=state, endpoint=endpoint)


def fallback(m: CatalogModel, target: CatalogModel, position: int = 0) -> Fallback:
    return Fallback.objects.create(model=m, target=target, position=position)


def key(team: str = "search", org: str = "acme", models=None) -> str:
    return keys.issue(team=team, org=org, models=models).secret
