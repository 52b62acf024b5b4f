"""Listening in on live updates in tests: what a signal carried, and what reached the channel layer."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from channels.layers import InMemoryChannelLayer
from django.dispatch import Signal

IN_MEMORY = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}


@contextmanager
def heard(signal: Signal) -> Iterator[list[dict[str, Any]]]:
    """Each send of ``signal`` while inside, as its keyword arguments (``sender`` among them)."""
    calls: list[dict[str, Any]] = []

    def receiver(sender: Any, **kwargs: Any) -> None:
        kwargs.pop("signal", None)
        calls.append({"sender": sender, **kwargs})

    signal.connect(receiver, weak=False)
    try:
        yield calls
    finally:
        signal.disconnect(receiver)


def group_sends(monkeypatch) -> list[tuple[str, dict[str, Any]]]:
    """Every ``group_send`` of the in-memory channel layer from now on, as (group, message), in order.

    What dashboard.live's outbox held until now is sent first, unrecorded: it was told before.
    """
    from dashboard import live

    live.outbox.flush()
    sent: list[tuple[str, dict[str, Any]]] = []
    original = InMemoryChannelLayer.group_send

    async def recording(self, group: str, message: dict[str, Any]) -> None:
        sent.append((group, message))
        await original(self, group, message)

    monkeypatch.setattr(InMemoryChannelLayer, "group_send", recording)
    return sent


def updates_sent(sent: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, dict[str, Any]]]:
    """What ``group_sends`` recorded once the outbox has sent what it held, each batch opened into its updates.

    dashboard.live holds what comes within a window of the last send and sends
    it as one ``batch``; a test asking what the pages were told asks this.
    """
    from dashboard import live

    live.outbox.flush()
    out: list[tuple[str, dict[str, Any]]] = []
    for group, message in sent:
        if message.get("kind") == live.BATCH:
            out += [(group, update) for update in message["data"]["updates"]]
        else:
            out.append((group, message))
    return out
