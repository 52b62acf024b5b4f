"""The beat's scheduler: each periodic run it sends is confirmed begun, or sent again.

A run the beat sends can vanish with a control host. Redis hands a message to
a worker blocked on the queue the instant it arrives; if that worker was just
SIGKILLed (the kernel has not yet closed its socket) or dies before it begins
the run, the message is gone: out of the queue, never acknowledged, so Redis
gives it back only after its visibility timeout (300 s), long after the run has
expired. Nothing on the worker's side closes that window (a CI run of
tests/deploy/test_multihost.py lost a reachability sweep to it): only the
sender can tell that a run is missing.

So a quarter period after sending a run, and each quarter period after that
until the run expires, the beat asks the database whether a worker began it
(``core.runs``: each run's id is recorded as it begins). While none has, it
sends the same run again under the same id, with the first send's expiry. A
worker that receives a run that already began skips it, so a run sent again
while the first copy was only waiting in a long queue still happens once.

While the database cannot be asked (a failover), nothing is sent again: no
worker could begin a run then either.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

from celery.beat import PersistentScheduler
from django.db import DatabaseError, connection

from core import runs

log = logging.getLogger("llmgw.beat")

SMALLEST_CHECK_S = 0.25


@dataclass(frozen=True)
class Sent:
    """A run the beat sent and no worker has yet been seen to begin."""

    entry: str
    task: str
    run_id: str
    every_s: float
    """How long between checks: a quarter of the entry's period."""
    next_check: float
    """Monotonic seconds."""
    expires: float
    """Monotonic seconds: after this no worker would begin it, so it is not sent again."""
    expires_at: datetime
    """The same instant on the wall clock, which a message carries."""
    sent_at: datetime
    """When it was first sent, on the wall clock."""
    resent: int = 0


def watch(
    entry: str, task: str, run_id: str, period_s: float, expires_s: float | None, now: float, wall: datetime
) -> Sent:
    """What to remember of a run sent at ``now`` (monotonic) and ``wall``, read just before sending it: checked a
    quarter period later, and each quarter period until it expires. A copy sent again expires no later than the
    first one did."""
    lifetime = min(period_s, expires_s) if expires_s else period_s
    every = max(SMALLEST_CHECK_S, period_s / 4)
    return Sent(entry, task, run_id, every, now + every, now + lifetime, wall + timedelta(seconds=lifetime), wall)


def after_check(sent: Sent, begun: bool, now: float) -> tuple[bool, Sent | None]:
    """Whether to send the run again, and what is still to be watched of it (None: nothing)."""
    if begun or now >= sent.expires:
        return False, None
    later = replace(sent, next_check=now + sent.every_s, resent=sent.resent + 1)
    # The last copy that could still be begun: nothing to ask of it after it expires.
    return True, (later if later.next_check < sent.expires else None)


class Scheduler(PersistentScheduler):
    """Celery's persistent scheduler, confirming each run it sends (see the module's docstring)."""

    def __init__(self, *args, **kwargs) -> None:
        self.watched: dict[str, Sent] = {}
        super().__init__(*args, **kwargs)

    def apply_async(self, entry, producer=None, advance=True, **kwargs):
        now, wall = time.monotonic(), datetime.now(UTC)
        result = super().apply_async(entry, producer=producer, advance=advance, **kwargs)
        period = getattr(entry.schedule, "seconds", None)  # None for a crontab entry: not confirmed
        if result is not None and getattr(result, "id", None) and period:
            expires = entry.options.get("expires")
            expires = expires if isinstance(expires, int | float) else None
            self.watched[entry.name] = watch(entry.name, entry.task, result.id, period, expires, now, wall)
        return result

    def tick(self, *args, **kwargs) -> float:
        wait = super().tick(*args, **kwargs)
        now = time.monotonic()
        for sent in [s for s in self.watched.values() if s.next_check <= now]:
            self._check(sent, now)
        if self.watched:
            soonest = min(s.next_check for s in self.watched.values())
            wait = min(wait, max(0.0, soonest - time.monotonic()))
        return wait

    def _check(self, sent: Sent, now: float) -> None:
        try:
            begun = runs.began(sent.task, sent.run_id, sent.sent_at)
        except DatabaseError as exc:
            # A connection broken by a failover stays broken until closed: the next check opens another.
            connection.close()
            log.warning("Cannot ask the database whether %s[%s] began (%s); asking again.", sent.task, sent.run_id, exc)
            later = replace(sent, next_check=now + sent.every_s)
            if later.next_check < sent.expires:
                self.watched[sent.entry] = later
            else:
                self.watched.pop(sent.entry, None)
            return
        again, still = after_check(sent, begun, now)
        if still is None:
            self.watched.pop(sent.entry, None)
        else:
            self.watched[sent.entry] = still
        if again:
            log.warning(
                "No worker began %s[%s] %.1f s after it was sent: sending it again (%d).",
                sent.task,
                sent.run_id,
                sent.every_s * (sent.resent + 1),
                sent.resent + 1,
            )
            self._send_again(sent)

    def _send_again(self, sent: Sent) -> None:
        entry = self.schedule.get(sent.entry)
        if entry is None:
            return
        options = {k: v for k, v in entry.options.items() if k != "expires"}
        options.setdefault("headers", {})["celery_beat_task"] = True
        try:
            self.send_task(
                entry.task, entry.args, entry.kwargs, task_id=sent.run_id, expires=sent.expires_at, **options
            )
        except Exception as exc:  # noqa: BLE001 - Redis away: the next check tries again, until the run expires
            log.warning("Could not send %s[%s] again: %s", sent.task, sent.run_id, exc)
