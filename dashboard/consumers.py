"""The console's websockets: one per page, each joining the one group dashboard.live publishes to.

Each consumer forwards ``live.update`` messages to the browser as JSON
(``{"kind", "subject", "data"}``) and nothing else: pages decide what to
re-fetch, and the database stays the one source of what is true. A page that
misses messages (a reconnect) re-fetches everything, so dropping is safe.

Only a logged-in account allowed to open the page (core.access) may listen, and only from a page
of this site. The socket is accepted and then closed with 4403 rather than
refused outright, because a refused handshake reaches the browser as a bare
1006 that a page cannot tell from a network failure; 4403 lets it say
"log in again" instead of retrying for ever.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any
from urllib.parse import urlsplit

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from core import access, outage
from dashboard import live, messages
from inventory.models import GPU, Node, NVLinkDomain

FORBIDDEN = 4403
TRY_AGAIN = 4503
"""Closed for a while (a 503 of websockets); autobahn accepts only 1000 and 3000-4999 from a server."""

FRAME_EVERY_S = 0.25
"""A page hears at most one frame per this long; a change waits at most this long to be sent.

A heartbeat storm (a rack rebooting, ten thousand nodes registering) publishes
hundreds of messages a second. Forwarded one frame each, they would keep a
browser re-rendering and its socket's buffer growing; a page needs only to
know, within a second, which of its parts to fetch again. A message after a
quiet spell goes out at once; what arrives within the next quarter second
waits and goes out with it in one frame (``batch``).
"""

MOST_IN_A_BATCH = 100
"""More messages than this in one window go out as ``resync``: the page fetches every part again.

Fetching every part costs the page what a reconnect does, and a frame
naming thousands of nodes would cost more than that to send and to read.
"""


def same_origin(scope: dict[str, Any]) -> bool:
    """The socket was opened by a page of this site (or by no page at all: a script sends no Origin).

    The session cookie rides along on any site's websocket, so without this a
    page elsewhere could listen to the fleet in an operator's browser.
    """
    headers = dict(scope.get("headers") or [])
    origin = headers.get(b"origin", b"").decode("latin-1")
    if not origin:
        return True
    host = headers.get(b"host", b"").decode("latin-1")
    return urlsplit(origin).netloc.lower() == host.lower()


def may_open(user: Any, door: str) -> bool:
    """Whether ``user`` may open the page ``door`` names (core.access: active staff holding its permissions)."""
    return access.refusal(user, door, "GET") is None


class LiveConsumer(AsyncJsonWebsocketConsumer):
    """Checks the operator, joins ``live_groups()``, forwards what ``wants()`` lets through."""

    joined: list[str]
    door = "console-fleet"
    """The page (its URL name) whose permissions a listener needs: the socket tells what the page shows."""

    def may_listen(self) -> bool:
        return may_open(self.scope.get("user"), self.door)

    async def connect(self) -> None:
        self.joined = []
        self.pending: list[dict[str, Any]] = []
        self.last_frame = float("-inf")
        self.flusher: asyncio.Task | None = None
        # Asked before the accept, so that an allowed page joins its groups as soon as it is accepted.
        allowed = same_origin(self.scope) and await database_sync_to_async(self.may_listen)()
        await self.accept()
        if not allowed:
            await self.close(code=FORBIDDEN)
            return
        groups = await self.live_groups()
        if groups is None:
            await self.close(code=4404)
            return
        for group in groups:
            await self.channel_layer.group_add(group, self.channel_name)
        self.joined = groups
        outage.redis.back()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """The consumer, with a channel layer that cannot be reached closing the socket instead of crashing it.

        Joining a group or waiting on the layer fails while Redis is down; the
        page is closed with 4503 (try again later) and reconnects, as it does
        after any close, and re-fetches what it missed. The outage is said
        once in the log (core.outage), not once per page and retry.
        """
        try:
            await super().__call__(scope, receive, send)
        except Exception as exc:
            cause = outage.connection_error(exc)
            if cause is None:
                raise
            outage.redis.failed(cause)
            with contextlib.suppress(Exception):
                await send({"type": "websocket.close", "code": TRY_AGAIN})

    async def disconnect(self, code: int) -> None:
        if getattr(self, "flusher", None) is not None:
            self.flusher.cancel()
            self.flusher = None
        for group in getattr(self, "joined", []):
            await self.channel_layer.group_discard(group, self.channel_name)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        """Pages only listen; anything they send is ignored."""

    async def live_update(self, message: dict[str, Any]) -> None:
        """A ``live.update`` from dashboard.live: its updates this page wants, forwarded and coalesced.

        A publisher's ``batch`` is opened and filtered update by update; a
        ``resync`` always passes. Sent at once after a quiet spell; within
        FRAME_EVERY_S of the last frame it is held and sent with whatever
        else arrives by then.
        """
        kind = message.get("kind")
        if kind == live.BATCH:
            opened = (message.get("data") or {}).get("updates") or []
            updates = [u for u in opened if u.get("kind") == live.RESYNC or self.wants(u)]
        elif kind == live.RESYNC or self.wants(message):
            updates = [message]
        else:
            updates = []
        if not updates:
            return
        self.pending += [{k: u[k] for k in ("kind", "subject", "data") if k in u} for u in updates]
        if self.flusher is not None:
            return
        loop = asyncio.get_running_loop()
        wait = self.last_frame + FRAME_EVERY_S - loop.time()
        if wait <= 0:
            await self.send_pending()
        else:
            self.flusher = loop.create_task(self.send_later(wait))

    async def send_later(self, wait: float) -> None:
        """send_pending after ``wait`` s; the socket may have closed meanwhile, and the page re-fetches then."""
        await asyncio.sleep(wait)
        with contextlib.suppress(Exception):
            await self.send_pending()

    async def send_pending(self) -> None:
        """One frame for everything held: the message itself when it is alone, else a batch or a resync."""
        self.flusher = None
        held, self.pending = self.pending, []
        if not held:
            return
        self.last_frame = asyncio.get_running_loop().time()
        if len(held) == 1:
            frame = held[0]
        elif any(u.get("kind") == live.RESYNC for u in held) or len(held) > MOST_IN_A_BATCH:
            # A publisher's resync stands for all it held; the page fetches everything either way.
            frame = messages.resync(live.told(held))
        else:
            frame = messages.batch(held)
        await self.send_json(dict(frame))

    async def live_groups(self) -> list[str] | None:
        """The groups to join; None when the page's subject does not exist."""
        raise NotImplementedError

    def wants(self, message: dict[str, Any]) -> bool:
        return True


def named_nodes(message: dict[str, Any]) -> set[str]:
    """The nodes a message is about: its subject for node messages, the sweep's lists for reachability."""
    out = set()
    if str(message.get("kind", "")).startswith("node."):
        out.add(str(message.get("subject", "")))
    data = message.get("data") or {}
    for key in ("unreachable", "lost"):
        if isinstance(data.get(key), list):
            out.update(str(n) for n in data[key])
    return out


class FleetConsumer(LiveConsumer):
    """Fleet, node list, all racks, fabrics and models: everything on the ``fleet`` group."""

    async def live_groups(self) -> list[str]:
        return [live.fleet_group()]


class NodeConsumer(LiveConsumer):
    """One node's page: the messages that name the node.

    Everything is published to ``fleet`` alone (the reachability sweep's one
    message names many nodes), so this joins ``fleet`` and picks its node out.
    """

    door = "console-node"

    async def live_groups(self) -> list[str] | None:
        self.node_name = await _node_name(self.scope["url_route"]["kwargs"]["pk"])
        if self.node_name is None:
            return None
        return [live.fleet_group()]

    def wants(self, message: dict[str, Any]) -> bool:
        return self.node_name in named_nodes(message)


class DomainConsumer(LiveConsumer):
    """One rack's page: messages about its trays, cards moving in or out of it, the rack going dark.

    An IMEX outage on a tray is not a domain move; the trays' own messages
    are what tell. Like NodeConsumer, it listens on ``fleet``, where
    everything is published, and picks out what concerns the rack.
    """

    door = "console-domain"

    async def live_groups(self) -> list[str] | None:
        pk = self.scope["url_route"]["kwargs"]["pk"]
        found = await _domain_nodes(pk)
        if found is None:
            return None
        self.domain_pk, (self.domain_key, self.trays) = str(pk), found
        return [live.fleet_group()]

    def wants(self, message: dict[str, Any]) -> bool:
        data = message.get("data") or {}
        moves = data.get("domain_moves") or []
        moved_here = any(self.domain_key in (m[1], m[2]) for m in moves if isinstance(m, list | tuple) and len(m) == 3)
        dark = self.domain_pk in (data.get("domains_dark") or []) + (data.get("domains_back") or [])
        return bool(named_nodes(message) & self.trays) or moved_here or dark


@database_sync_to_async
def _node_name(pk: int) -> str | None:
    return Node.objects.filter(pk=pk).values_list("name", flat=True).first()


@database_sync_to_async
def _domain_nodes(pk: int) -> tuple[str, set[str]] | None:
    """The domain's key and the nodes whose cards name it, joined or not (a tray that left keeps its ClusterUUID)."""
    domain = NVLinkDomain.objects.filter(pk=pk).first()
    if domain is None:
        return None
    rows = GPU.objects.filter(cluster_uuid__iexact=domain.cluster_uuid, clique_id=domain.clique_id)
    joined = GPU.objects.filter(domain=domain)
    return domain.key, set(rows.values_list("node__name", flat=True)) | set(joined.values_list("node__name", flat=True))
