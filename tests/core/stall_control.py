"""A control command that holds a worker's main thread (tests/core/test_worker_guard.py loads it with ``-I``)."""

from __future__ import annotations

import time

from celery.worker.control import control_command


@control_command(args=[("seconds", float)], signature="<seconds>")
def llmgw_test_stall(state, seconds: float = 30.0) -> dict:
    """Sleep in the main thread, as a call without a timeout would hang there."""
    time.sleep(seconds)
    return {"ok": "stalled"}
