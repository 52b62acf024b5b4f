"""Since when a periodic task has been watching without a break.

A task that judges the fleet by what is *missing* from the database — the
reachability sweep calls a node silent when its last heartbeat is old — is
wrong whenever it was blind: while the database fails over, no sweep runs,
no heartbeat is written, and the serve processes hold the beats they took
until their flushers can write them. The first sweep after the database is
back would otherwise see every node silent since the failover began, and
mark them unreachable a second before their held beats land.

So the task records each pass it commits (``TaskRun.last_pass``) and the
start of its current stretch of passes none of which came more than ``gap``
after the one before (``TaskRun.unbroken_since``). The caller decides what a
short stretch forbids; the sweep judges no silence until it has watched for
one grace.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from core.models import TaskRun


def stretch_start(previous_pass: datetime | None, since: datetime | None, now: datetime, gap_s: float) -> datetime:
    """The start of the stretch a pass at ``now`` belongs to.

    No earlier pass (a new deployment, or a row from before these columns) or
    one more than ``gap_s`` ago starts a new stretch at ``now``. A pass that
    seems to come before the previous one (a clock stepped back) continues
    the stretch: a step of the clock is not blindness.
    """
    if previous_pass is None or since is None or (now - previous_pass) > timedelta(seconds=gap_s):
        return now
    return min(since, now)


def unbroken_since(name: str, now: datetime, gap_s: float) -> datetime:
    """Record a pass of task ``name`` at ``now`` and answer since when its passes have come unbroken.

    Call it inside the task's transaction (``core.locks.exclusive``, which
    holds the row): a pass that fails rolls this back with it, so only work
    that committed counts as watching.
    """
    run, _ = TaskRun.objects.get_or_create(name=name)
    since = stretch_start(run.last_pass, run.unbroken_since, now, gap_s)
    TaskRun.objects.filter(pk=run.pk).update(last_pass=now, unbroken_since=since)
    return since
