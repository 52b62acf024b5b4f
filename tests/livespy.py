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
    """Every ``group_send`` of the in-memory channel layer from now on, as (group, message), in order."""
    sent: list[tuple[str, dict[str, Any]]] = []
    original = InMemoryChannelLayer.group_send

    async def recording(self, group: str, message: dict[str, Any]) -> None:
        sent.append((group, message))
        await original(self, group, message)

    monkeypatch.setattr(InMemoryChannelLayer, "group_send", recording)
    return sent
