"""Each run of a task begins once, however many times its message arrives.

A run's message can reach workers twice. The beat sends a periodic run again,
under the same id, when no worker has begun it a quarter period after it was
sent (``llmgw.beat``: a worker that took it from Redis and was killed before
beginning it took it along); and Redis hands a message that was taken and
never acknowledged back to the queue after its visibility timeout. The task's
row (``TaskRun``) keeps the id of the run that last began; a delivery of that
same run is ignored before it does anything, so a run sent twice to living
workers happens once.

Only the last run's id is kept: a duplicate of an older run that arrives after
a newer one began would run again. Every periodic entry expires within its
period (``llmgw.celery``), so none can arrive that late.
"""

from __future__ import annotations

import logging
from datetime import datetime

from celery import Task
from celery.exceptions import Ignore
from django.utils import timezone

from core.models import TaskRun

log = logging.getLogger("llmgw.tasks")


def begin(name: str, run_id: str, now: datetime | None = None) -> bool:
    """Record that run ``run_id`` of task ``name`` begins now; False when that run had already begun.

    One statement decides: PostgreSQL makes a second delivery racing the first
    wait for its row and then read the first one's id, so only one of two
    concurrent deliveries of a run begins it.
    """
    now = now or timezone.now()
    mine = TaskRun.objects.filter(name=name).exclude(last_run=run_id)
    if mine.update(last_started=now, last_run=run_id):
        return True
    # No row yet (the task's first run here), or the row already names this run.
    _, created = TaskRun.objects.get_or_create(name=name, defaults={"last_started": now, "last_run": run_id})
    return created


def began(name: str, run_id: str, sent: datetime) -> bool:
    """Whether run ``run_id`` of task ``name``, sent at ``sent``, has begun (what the beat asks of a run it sent).

    A run of the same task sent by someone else (the reconciler queued by a
    change) that began after ``sent`` counts too: it did the work, and it has
    replaced ``run_id`` in the row.
    """
    row = TaskRun.objects.filter(name=name).values_list("last_run", "last_started").first()
    return row is not None and (row[0] == run_id or (row[1] is not None and row[1] >= sent))


class Run(Task):
    """The base of every periodic task (``base=Run``): its run is recorded as it begins, a second delivery skipped.

    ``before_start`` runs after the worker's prerun signal and before the task's
    body; raising Ignore there leaves the run IGNORED, with no result and no
    failure.
    """

    def before_start(self, task_id, args, kwargs) -> None:
        if task_id and not begin(self.name, task_id):
            log.info("%s[%s] had already begun: this delivery of it is skipped", self.name, task_id)
            raise Ignore()
