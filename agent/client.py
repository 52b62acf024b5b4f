"""The agent's side of the protocol: an async client of the control plane.

Used by the real agent and by every simulated agent alike, so the simulator
speaks exactly the protocol the fleet does.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from agent import protocol

TIMEOUT_S = 10.0


class Refused(Exception):
    """The control plane answered and said no (4xx): retrying the same request will not help."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


class Unreachable(Exception):
    """The control plane could not be reached, or failed (5xx): try again later."""


class Busy(Unreachable):
    """The control plane answered 503 or 429 with ``Retry-After``: it works, but cannot take this now.

    A database failing over answers so (core.errors): the light heartbeat is
    still taken from memory, so the agent keeps beating and sends this request
    again after ``retry_after_s`` rather than backing off altogether.
    """

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


def retry_after(value: str | None) -> float | None:
    """``Retry-After`` in seconds (the delta form; an HTTP date is not sent by llmgw), or None."""
    try:
        seconds = float(value) if value is not None else None
    except ValueError:
        return None
    return seconds if seconds is not None and seconds >= 0 else None


@dataclass
class Registration:
    node: str
    credential: str
    heartbeat_interval_s: float = protocol.HEARTBEAT_INTERVAL_S
    report_interval_s: float = protocol.REPORT_INTERVAL_S


class ControlPlane:
    """One node's connection to the control plane."""

    def __init__(
        self,
        server: str,
        client: httpx.AsyncClient | None = None,
        observe: Callable[[str, float, int], None] | None = None,
    ) -> None:
        self.server = server.rstrip("/")
        self.client = client or httpx.AsyncClient(timeout=TIMEOUT_S)
        self.credential: str | None = None
        self.observe = observe  # (path, seconds, status; 0 when unreachable): benchmarks listen here

    async def close(self) -> None:
        await self.client.aclose()

    async def _post(self, path: str, token: str, body: Any) -> dict:
        started = time.perf_counter()
        try:
            answer = await self.client.post(self.server + path, json=body, headers={"Authorization": f"Bearer {token}"})
        except httpx.HTTPError as exc:
            if self.observe:
                self.observe(path, time.perf_counter() - started, 0)
            raise Unreachable(f"{self.server}: {type(exc).__name__}: {exc}") from None
        if self.observe:
            self.observe(path, time.perf_counter() - started, answer.status_code)

        wait = retry_after(answer.headers.get("retry-after"))
        if answer.status_code in (429, 503) and wait is not None:
            raise Busy(f"{self.server} answered {answer.status_code}, retry after {wait:g} s", wait)
        if answer.status_code >= 500:
            raise Unreachable(f"{self.server} answered {answer.status_code}")
        try:
            data = answer.json()
        except ValueError:
            data = {"error": answer.text[:200]}
        if answer.status_code >= 400:
            raise Refused(answer.status_code, data.get("error", "no reason given") if isinstance(data, dict) else "")
        return data

    async def register(self, join_token: str, name: str, machine_id: str, report: dict | None) -> Registration:
        body: dict[str, Any] = {"name": name, "machine_id": machine_id}
        if report is not None:
            body["report"] = report
        data = await self._post(protocol.REGISTER_PATH, join_token, body)
        self.credential = data["credential"]
        return Registration(
            node=data["node"],
            credential=data["credential"],
            heartbeat_interval_s=float(data.get("heartbeat_interval_s", protocol.HEARTBEAT_INTERVAL_S)),
            report_interval_s=float(data.get("report_interval_s", protocol.REPORT_INTERVAL_S)),
        )

    async def report(self, report: dict) -> dict:
        assert self.credential, "register first"
        return await self._post(protocol.REPORT_PATH, self.credential, report)

    async def upload_scan(self, body: dict) -> dict:
        assert self.credential, "register first"
        return await self._post(protocol.SCAN_PATH, self.credential, body)

    async def heartbeat(self, beat: dict) -> dict:

        assert self.credential, "register first"
        return await self._post(protocol.HEARTBEAT_PATH, self.credential, beat)
