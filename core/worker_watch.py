"""Whether a Celery worker has stopped doing its job while everything around it works: the rule, without I/O.

A worker's main process takes tasks from Redis and hands them to its pool.
Two failures leave the process alive and its log silent, so that neither a
supervisor nor an operator sees them:

- **stalled**: its event loop has not turned for a long while although
  Redis answers (the main thread blocked: a lock, a call with no timeout);
- **deaf**: its loop turns, it has room for more tasks, a task sent to it
  alone (a canary, on the queue only it consumes) has waited all along, and
  it received nothing (its broker connection lost track of, as kombu and
  redis-py have done in several releases: celery/celery#8030, #8091, #9054,
  #10205). With a second worker taking the shared queue's tasks, the shared
  queue alone would never show it.

With one worker per control host, a dead-quiet worker on the host that has
the others' work stops every periodic task that host would run: dead hosts'
reservations are not given back, unreachable nodes are not marked. Either
verdict asks the worker to exit, and its supervisor (systemd's
``Restart=always`` in deploy/systemd/llmgw-worker.service) starts a new one.

While Redis does not answer nothing is judged: tasks cannot be taken by
anyone, and the consumer is in its own reconnect loop, which holds the event
loop by design. Once Redis answers again that loop may wait out its current
interval (``reconnect_s``: kombu's ``ensure_connection`` waits at most 30 s
between tries) before the event loop turns again, so a stall is counted only
from then. A worker without room (every pool process busy with its
prefetched tasks) is not deaf, and one that received a task within the
window is not either.

``LLMGW_WORKER_DEAF_S`` is the window (90 s); 0 turns the watch off.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Seen:
    """One look at the worker: what Redis said and what the worker's own loop recorded (monotonic seconds)."""

    now: float
    redis_answers: bool
    waiting: int
    """Tasks sent to this worker alone and not received yet (its canaries; 0 when Redis did not answer)."""
    has_room: bool
    """The worker holds fewer tasks than its prefetch limit: it would take one if it were given one."""
    last_tick: float
    """When its event loop last ran a timer."""
    last_received: float
    """When it last received a task (or started, before its first)."""


class WorkerWatch:
    """The verdict over successive looks: a sentence saying what is wrong, or None while the worker is fine."""

    def __init__(self, window_s: float, reconnect_s: float = 30.0, silence_s: float = 3.0) -> None:
        self.window_s = window_s
        self.reconnect_s = reconnect_s
        self.silence_s = silence_s
        self.answering_since: float | None = None
        self.waiting_since: float | None = None
        self.silent_since: float | None = None

    def look(self, seen: Seen) -> str | None:
        if not seen.redis_answers:
            # One look that failed (a publish slower than its timeout on a busy machine) is no outage, and
            # starting the windows over at each would put the verdict off for ever; silence that lasts is.
            if self.silent_since is None:
                self.silent_since = seen.now
            if seen.now - self.silent_since >= self.silence_s:
                self.answering_since = self.waiting_since = None
            return None
        self.silent_since = None
        if self.answering_since is None:
            self.answering_since = seen.now
        if seen.waiting > 0 and seen.has_room:
            # A task received since the wait began ends it: what waits now waits from here.
            if self.waiting_since is None or seen.last_received > self.waiting_since:
                self.waiting_since = seen.now
        else:
            self.waiting_since = None
        answered = seen.now - self.answering_since
        # Nothing is expected of the loop before a reconnect's longest wait has passed since Redis answered.
        expected_from = self.answering_since + self.reconnect_s
        overdue = seen.now - max(seen.last_tick, expected_from)
        if overdue >= self.window_s:
            stalled = seen.now - seen.last_tick
            return f"its event loop has not turned for {stalled:.0f} s although Redis has answered for {answered:.0f} s"
        if self.waiting_since is not None and seen.last_received <= self.waiting_since:
            waited = seen.now - self.waiting_since
            if seen.now - max(self.waiting_since, expected_from) >= self.window_s:
                return (
                    f"a task sent to it alone has waited {waited:.0f} s ({seen.waiting} unanswered) while it had "
                    "room for more, and it received nothing"
                )
        return None
