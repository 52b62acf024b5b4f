"""Placement's Celery tasks."""

from __future__ import annotations

from celery import shared_task
from celery.signals import task_postrun

from core.locks import exclusive
from core.runs import Run
from placement.writes import reconciler

LOCK = "placement.tasks.reconcile"


@shared_task(name="placement.tasks.reconcile", ignore_result=True, base=Run)
def reconcile() -> dict:
    """One reconciling pass, under a lock: a second worker that finds it held skips this run.

    Nothing is passed in: a model, node or replica deleted since the run was
    queued is simply not in the snapshot it loads. Runs every few seconds from
    beat, and soon after anything it depends on changes (placement.signals).
    """
    with exclusive(LOCK) as held:
        if not held:
            return {"skipped": "another worker holds the lock"}
        return reconciler.reconcile().summary()


@task_postrun.connect
def _let_go_of_an_idle_planner(**_) -> None:
    """After each task, a process that has not planned for a while lets go of its planner; its pages go back to
    the system when the next task ends (llmgw.celery gives back after every task)."""
    reconciler.let_go_if_idle()
