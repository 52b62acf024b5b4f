"""A control command that holds a worker's main thread, and a task that holds a pool process.

tests/core/test_worker_guard.py loads this into its workers with ``-I``.
"""

from __future__ import annotations

import time
from pathlib import Path

from celery import shared_task
from celery.worker.control import control_command


@control_command(args=[("seconds", float)], signature="<seconds>")
def llmgw_test_stall(state, seconds: float = 30.0) -> dict:
    """Sleep in the main thread, as a call without a timeout would hang there."""
    time.sleep(seconds)
    return {"ok": "stalled"}


@shared_task(name="llmgw_test.hold")
def hold(seconds: float, started: str) -> None:
    """Keep one pool process busy: the file ``started`` says it began."""
    Path(started).touch()
    time.sleep(seconds)
