"""Running a topology scan of one fabric: ``ibnetdiscover`` from one port of this node."""

from __future__ import annotations

import asyncio
import time

from agent.discovery.tools import run_tool

SCAN_TIMEOUT_S = 300.0


def scan_argv(request: dict) -> list[str]:
    argv = ["ibnetdiscover"]
    if request.get("hca"):
        argv += ["-C", str(request["hca"])]
    if request.get("port"):
        argv += ["-P", str(request["port"])]
    return argv


async def run_scan(request: dict) -> dict:
    """{"output", "took_ms"} or {"error"}: a missing tool or a failed run says which."""
    started = time.monotonic()
    result = await asyncio.to_thread(run_tool, scan_argv(request), SCAN_TIMEOUT_S)
    took_ms = int((time.monotonic() - started) * 1000)
    if result.error:
        # A scan that printed part of a map and then failed is not a map to keep.

        return {"error": result.error, "took_ms": took_ms}
    return {"output": result.stdout or "", "took_ms": took_ms}
