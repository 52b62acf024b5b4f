"""A Celery worker that has gone quiet exits, for its supervisor to start it again (core.worker_watch).

A consumer bootstep stamps each turn of the worker's event loop (a timer of
its hub, every second) and each task received; a thread of the main process
sends the worker a canary every few seconds (a task that does nothing, on
the queue only this worker consumes, ``<name>.dq2``: Celery's
``worker_direct``), over a connection of its own with short timeouts (never
the consumer's, which are what may have gone wrong), and asks the rule.

On a verdict it logs one line saying what it saw, writes every thread's
stack to the log (where the main thread was stuck), and exits: a warm
shutdown (SIGTERM, what systemd sends) when the loop still turns, since the
pool may be running tasks; at once (exit status 70) when the loop is stuck,
since then no signal handler would run, or when the warm shutdown has not
ended within a minute (or a window, if that is shorter).

Only with the Redis broker; the embedded broker runs inside ``llmgw serve``.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import sys
import threading
import time

from celery import bootsteps, shared_task
from celery.signals import task_received
from celery.utils.nodenames import worker_direct
from celery.worker import state as worker_state

from core.worker_watch import Seen, WorkerWatch

log = logging.getLogger("llmgw.worker")

DEFAULT_WINDOW_S = 90.0
STUCK_EXIT_STATUS = 70
"""EX_SOFTWARE: the worker's own main thread was stuck."""
SHUTDOWN_GRACE_S = 60.0
CANARY = "llmgw.worker_guard.canary"
SEND_TIMEOUT_S = 2.0

_last_tick = time.monotonic()
_last_received = time.monotonic()
_started = False


def window_s(env: dict[str, str] | os._Environ = os.environ) -> float:
    """LLMGW_WORKER_DEAF_S: how long a worker may stay quiet; 0 (or less) turns the watch off."""
    raw = env.get("LLMGW_WORKER_DEAF_S", "").strip()
    if not raw:
        return DEFAULT_WINDOW_S
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"LLMGW_WORKER_DEAF_S={raw!r} is not a number of seconds") from None


@shared_task(name=CANARY, ignore_result=True)
def canary() -> None:
    """Nothing: that the worker received it is the point."""


@task_received.connect
def _received(**_) -> None:
    global _last_received
    _last_received = time.monotonic()


class Guard(bootsteps.StartStopStep):
    """Started with the consumer's task step (again after each reconnect): the loop's stamp and, once, the watch."""

    requires = ("celery.worker.consumer.tasks:Tasks",)

    def __init__(self, parent, **kwargs) -> None:
        super().__init__(parent, **kwargs)
        self.window = window_s()
        self.tref = None

    def start(self, c) -> None:
        global _started, _last_tick
        url = str(c.app.conf.broker_url or "")
        if self.window <= 0 or not url.startswith(("redis://", "rediss://")) or c.hub is None:
            return
        _last_tick = time.monotonic()
        self.tref = c.hub.call_repeatedly(1.0, _tick)
        if not _started:
            _started = True
            threading.Thread(target=_watch, args=(c, self.window), name="llmgw-worker-watch", daemon=True).start()

    def stop(self, c) -> None:
        if self.tref is not None:
            self.tref.cancel()
            self.tref = None


def _tick() -> None:
    global _last_tick
    _last_tick = time.monotonic()


def _has_room(c) -> bool:
    """Whether the consumer would take another task: under its prefetch limit and, with prefetch off
    (worker_disable_prefetch), under its pool's size, as Celery's own check for that setting counts."""
    limits = [getattr(getattr(c, "qos", None), "value", 0) or 0]
    if c.app.conf.worker_disable_prefetch:
        limits.append(getattr(c.controller, "max_concurrency", None) or c.pool.num_processes)
    limit = min((n for n in limits if n > 0), default=0)
    return limit == 0 or len(worker_state.reserved_requests) < limit


def _send_canary(c, expires: float) -> None:
    """A canary on this worker's own queue, over a connection made for it (raises when Redis does not answer)."""
    options = {"socket_timeout": SEND_TIMEOUT_S, "socket_connect_timeout": SEND_TIMEOUT_S}
    with c.app.connection_for_write(transport_options=options) as conn:
        conn.ensure_connection(max_retries=1)
        c.app.send_task(
            CANARY, queue=worker_direct(c.hostname), connection=conn, expires=expires, retry=False, ignore_result=True
        )


def _watch(c, window: float) -> None:
    watch = WorkerWatch(window)
    every = max(0.5, min(5.0, window / 6))
    while True:
        time.sleep(every)
        # One every look, so one is always on its way: the rule counts the wait from the last task received.
        # A Redis that restarted empty lost the earlier ones, and each expires after a window.
        try:
            _send_canary(c, expires=window)
            answers = True
        except Exception:  # noqa: BLE001 - any failure to publish is Redis not answering, for this rule
            answers = False
        seen = Seen(time.monotonic(), answers, int(answers), _has_room(c), _last_tick, _last_received)
        why = watch.look(seen)
        if why is not None:
            _leave(why, stuck=seen.now - seen.last_tick >= window, grace_s=min(SHUTDOWN_GRACE_S, window))
            return


def _leave(why: str, *, stuck: bool, grace_s: float) -> None:
    log.error("[pid %d] This worker is quiet: %s. It exits for its supervisor to start it again.", os.getpid(), why)
    # sys.stderr is Celery's logging proxy in a worker; the stacks go to the process's own standard error.
    faulthandler.dump_traceback(file=sys.__stderr__, all_threads=True)
    if not stuck:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(grace_s)
    os._exit(STUCK_EXIT_STATUS)
