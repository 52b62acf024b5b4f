"""Telling open pages what changed: the one place that publishes to Channels groups.

One group, ``fleet``: every page joins it and picks out what concerns it
(dashboard.consumers), so messages sent to a group per node or NVLink domain
as well reached nobody, and finding those groups cost a query per report.
Messages are small JSON dicts, their kinds declared in dashboard.messages;
consumers forward them as they are. Lower apps do not call this: they send
their signals, which dashboard.receivers turns into messages.

Publishing never fails its caller: when the channel layer (Redis) is down,
the database still holds the truth, so the change is logged and dropped, and
publishing is skipped for a few seconds rather than making every heartbeat
wait on a dead connection. Pages reload their state when their websocket
reconnects, so nothing is lost for good.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Mapping
from typing import Any, TypedDict

from asgiref.sync import SyncToAsync, async_to_sync
from channels.layers import get_channel_layer

from core import outage

log = logging.getLogger(__name__)
BACKOFF_S = 5.0
MESSAGE_TYPE = "live.update"


class Update(TypedDict, total=False):
    """What a page receives: what changed (``kind``, one of dashboard.messages) and about what (``subject``)."""

    kind: str
    subject: str
    data: Mapping[str, Any]


FLEET = "fleet"
BATCH = "batch"
RESYNC = "resync"
"""The two kinds that carry other updates; dashboard.messages declares them with the rest and builds them."""


def fleet_group() -> str:
    """The group every console page joins."""
    return FLEET


class _Breaker:
    """Skips publishing for a while after the layer failed, so callers never queue on it."""

    def __init__(self) -> None:
        self.down_until = 0.0
        self.lock = threading.Lock()

    def open(self) -> bool:
        return time.monotonic() < self.down_until

    def trip(self, exc: Exception) -> None:
        # The layer is Redis: said once per outage, with the process's other users of it (core.outage).
        outage.redis.failed(exc)
        with self.lock:
            self.down_until = time.monotonic() + BACKOFF_S

    def reset(self) -> None:
        self.down_until = 0.0


breaker = _Breaker()


FRAME_EVERY_S = 0.25
"""A process sends the layer at most one message per group this often; a change waits at most this long.

A storm (ten thousand nodes registering, a rack rebooting) makes hundreds of
changes a second in the processes that take reports. Sent one layer message
each, every open page's channel in Redis filled to its capacity and dropped
the rest, and the page's consumer, reading them one by one in the same
process as the heartbeats, fell tens of seconds behind. Held for a quarter
second and sent as one ``batch``, they are a few messages a second however
large the storm. The first change after a quiet spell is sent at once.
"""

MOST_IN_A_MESSAGE = 1000
"""More updates than this for one group in one window are sent as one ``resync`` instead.

A page's socket filters a batch (a node's page keeps its node's updates) and
coalesces again (dashboard.consumers), so this bound only caps what one
layer message carries: about 300 KB of node reports.
"""


class _Outbox:
    """The updates this process holds for the layer, sent by one timer per window.

    Forked processes (Celery's prefork pool) start with an empty outbox of
    their own: what the parent held is the parent's to send.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        """Drop what is held and forget the last send (tests; a child after fork)."""
        self.pid = os.getpid()
        self.held: list[tuple[list[str], Update]] = []
        self.last_sent = float("-inf")
        self.timer: threading.Timer | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

    def put(self, updates: list[tuple[list[str], Update]]) -> bool:
        """Send ``updates`` now if the window is open, else hold them for the window's end; False if not sent."""
        with self.lock:
            if self.pid != os.getpid():
                self.reset()
            self.loop = _server_loop() or self.loop
            if self.timer is not None:
                self.held += updates
                return True
            wait = self.last_sent + FRAME_EVERY_S - time.monotonic()
            if wait > 0:
                self.held += updates
                self.timer = threading.Timer(wait, self.flush)
                self.timer.daemon = True
                self.timer.start()
                return True
            self.last_sent = time.monotonic()
        return _send(coalesced(updates))

    def flush(self) -> bool:
        """Send what is held now (the window's timer; a test that wants it without waiting)."""
        with self.lock:
            if self.timer is not None:
                self.timer.cancel()
            held, self.held, self.timer = self.held, [], None
            if not held:
                return True
            self.last_sent = time.monotonic()
            loop = self.loop
        if breaker.open():
            return False
        if loop is not None and loop.is_running():
            # On the server's own loop, as a request's send is (asgiref sends it there): its connections
            # to Redis are kept, and the in-memory layer of an embedded server wakes its readers only there.
            asyncio.run_coroutine_threadsafe(_send_on_loop(coalesced(held)), loop)
            return True
        return _send(coalesced(held))


def coalesced(held: list[tuple[list[str], Update]]) -> list[tuple[list[str], Update]]:
    """What a window held, as one message per group: the update when alone, a batch, or a resync.

    Order is kept within each group, which is all a page sees. Batches are
    never nested: a batch handed in is opened, and a resync among the updates
    (or more than MOST_IN_A_MESSAGE of them) makes the group's message one
    resync, counting all it stands for.
    """
    by_group: dict[str, list[Update]] = {}
    for groups, update in held:
        opened = (update.get("data") or {}).get("updates", []) if update.get("kind") == BATCH else [update]
        for group in groups:
            by_group.setdefault(group, []).extend(opened)
    out: list[tuple[list[str], Update]] = []
    for group, updates in by_group.items():
        if len(updates) == 1:
            out.append(([group], updates[0]))
        elif any(u.get("kind") == RESYNC for u in updates) or len(updates) > MOST_IN_A_MESSAGE:
            out.append(([group], Update(kind=RESYNC, subject=FLEET, data={"held": told(updates)})))
        else:
            out.append(([group], Update(kind=BATCH, subject=FLEET, data={"updates": updates})))
    return out


def told(updates: list[Update]) -> int:
    """How many changes ``updates`` tell of: one each, and a resync as many as it stands for."""
    return sum(int((u.get("data") or {}).get("held", 1)) if u.get("kind") == RESYNC else 1 for u in updates)


outbox = _Outbox()


def reset() -> None:
    """Forget the pause after a failure and what is held (tests start each from here)."""
    breaker.reset()
    with outbox.lock:
        if outbox.timer is not None:
            outbox.timer.cancel()
        outbox.reset()


def publish(groups: list[str], update: Update) -> bool:
    """Send ``update`` to each group, now or within FRAME_EVERY_S; False when it could not be sent (and was dropped)."""
    return publish_many([(groups, update)])


def publish_many(updates: list[tuple[list[str], Update]]) -> bool:
    """Send several updates, each to its groups, together; False when they could not be sent.

    True means sent, or held for the window's end (``outbox``); a send that
    fails then is logged and pauses publishing (``breaker``), as one now would.
    """
    if breaker.open() or not updates:
        return False
    return outbox.put(updates)


def _server_loop() -> asyncio.AbstractEventLoop | None:
    """The event loop of the ASGI server this thread works for (a request's thread), or None (a plain thread).

    asgiref keeps it per thread for the threads sync_to_async runs, with the
    pid it belongs to, since a fork leaves the attribute behind; missing
    attributes (another asgiref) mean None, and sends use a loop of their own.
    """
    local = SyncToAsync.threadlocal
    if getattr(local, "main_event_loop_pid", None) != os.getpid():
        return None
    return getattr(local, "main_event_loop", None)


async def _send_on_loop(updates: list[tuple[list[str], Update]]) -> None:
    """_send's work, awaited on a running loop; a failure pauses publishing as _send's does."""
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        await _group_sends(layer, updates)
    except Exception as exc:  # noqa: BLE001 - any layer failure means the same thing here
        breaker.trip(exc)
        return
    outage.redis.back()


async def _group_sends(layer: Any, updates: list[tuple[list[str], Update]]) -> None:
    for groups, update in updates:
        message = {"type": MESSAGE_TYPE, **update}
        for group in groups:
            await layer.group_send(group, message)


def _send(updates: list[tuple[list[str], Update]]) -> bool:
    """Send to the layer in one go, since each call from synchronous code has an event loop and connections of its own.

    A flush that announced 300 nodes back one by one opened and closed 300
    connections to Redis.
    """
    layer = get_channel_layer()
    if layer is None:
        return False

    try:
        async_to_sync(_group_sends)(layer, updates)
    except Exception as exc:  # noqa: BLE001 - any layer failure means the same thing here
        breaker.trip(exc)
        return False
    outage.redis.back()
    return True
