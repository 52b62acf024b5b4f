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

import logging
import threading
import time
from collections.abc import Mapping
from typing import Any, TypedDict

from asgiref.sync import async_to_sync
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


def publish(groups: list[str], update: Update) -> bool:
    """Send ``update`` to each group; False when it could not be sent (and was dropped)."""
    return publish_many([(groups, update)])


def publish_many(updates: list[tuple[list[str], Update]]) -> bool:
    """Send several updates, each to its groups, in one go; False when they could not be sent.

    One go, because each call from synchronous code runs in an event loop of
    its own with connections of its own: a flush that announced 300 nodes
    back one by one opened and closed 300 connections to Redis.
    """
    if breaker.open() or not updates:
        return False
    layer = get_channel_layer()
    if layer is None:
        return False

    async def send_all() -> None:
        for groups, update in updates:
            message = {"type": MESSAGE_TYPE, **update}
            for group in groups:
                await layer.group_send(group, message)

    try:
        async_to_sync(send_all)()
    except Exception as exc:  # noqa: BLE001 - any layer failure means the same thing here
        breaker.trip(exc)
        return False
    outage.redis.back()
    return True
