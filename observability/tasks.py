"""Periodic work of the control plane itself, and the record of every task run."""

from __future__ import annotations

import time

from celery import shared_task, states
from celery.signals import task_failure, task_postrun, task_prerun
from django.db.models import F
from django.utils import timezone

from core.locks import exclusive
from core.models import Finding, TaskRun
from core.runs import Run
from observability import metrics, signals, sweeps

RECONCILE_TASK = "placement.tasks.reconcile"
DOCTOR_SWEEP_TASK = "observability.tasks.doctor_sweep"
# task id -> when it started (monotonic), for the reconcile histogram; only this worker's own runs.
_started_at: dict[str, float] = {}


@shared_task(name="observability.tasks.tick", ignore_result=True, base=Run)
def tick() -> str:
    """Proves the worker and beat are alive; its TaskRun row is what /healthz reads."""
    return timezone.now().isoformat()


@shared_task(name=DOCTOR_SWEEP_TASK, ignore_result=True, base=Run)
def doctor_sweep() -> dict:
    """Fleet-wide checks kept as findings (observability.sweeps); safe to run twice, never twice at once.

    Nothing is passed in: a node or model deleted since the last run is simply
    not found again, and its findings resolve.
    """
    with exclusive(DOCTOR_SWEEP_TASK) as held:
        if not held:
            return {"skipped": "another worker holds the lock"}
        result = sweeps.sweep(timezone.now())
    if result.changed:
        signals.findings_changed.send(sender=Finding, result=result)
    return {"opened": len(result.opened), "resolved": len(result.resolved), "open": result.still_open}


def _skipped(retval) -> bool:
    return isinstance(retval, dict) and "skipped" in retval


@task_prerun.connect
def _started(task=None, task_id=None, **_kw) -> None:
    # The run's start is recorded by the task itself as it begins (core.runs.Run), once per run.
    if task.name == RECONCILE_TASK:
        _started_at[task_id] = time.monotonic()
        metrics.begin_task_run()


@task_postrun.connect
def _finished(task=None, task_id=None, state=None, retval=None, **_kw) -> None:
    if state == states.IGNORED:
        # A second delivery of a run that had begun (core.runs): the run is the first delivery's.
        _started_at.pop(task_id, None)
        return
    fields = {"last_finished": timezone.now(), "last_ok": state == "SUCCESS", "runs": F("runs") + 1}
    if state == "SUCCESS":
        fields["last_error"] = ""
    TaskRun.objects.filter(name=task.name).update(**fields)
    started = _started_at.pop(task_id, None)
    # A run that found the lock held did no reconciling: its few milliseconds would only flatter the figure.
    if started is not None and state == "SUCCESS" and not _skipped(retval) and not metrics.observed_in_this_run():
        metrics.observe_reconcile(time.monotonic() - started)


@task_failure.connect
def _failed(sender=None, exception=None, **_kw) -> None:
    TaskRun.objects.filter(name=sender.name).update(last_error=f"{type(exception).__name__}: {exception}"[:2000])
