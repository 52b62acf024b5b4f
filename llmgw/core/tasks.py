"""Periodic work of the control plane itself, and the record of every task run."""

from __future__ import annotations

from celery import shared_task
from celery.signals import task_failure, task_postrun, task_prerun
from django.db.models import F
from django.utils import timezone

from llmgw.core.models import TaskRun


@shared_task(name="llmgw.core.tasks.tick", ignore_result=True)
def tick() -> str:
    """Proves the worker and beat are alive; its TaskRun row is what /healthz reads."""
    return timezone.now().isoformat()


@task_prerun.connect
def _started(task=None, **_kw) -> None:
    TaskRun.objects.update_or_create(name=task.name, defaults={"last_started": timezone.now()})


@task_postrun.connect
def _finished(task=None, state=None, **_kw) -> None:
    fields = {"last_finished": timezone.now(), "last_ok": state == "SUCCESS", "runs": F("runs") + 1}
    if state == "SUCCESS":
        fields["last_error"] = ""
    TaskRun.objects.filter(name=task.name).update(**fields)


@task_failure.connect
def _failed(sender=None, exception=None, **_kw) -> None:
    TaskRun.objects.filter(name=sender.name).update(last_error=f"{type(exception).__name__}: {exception}"[:2000])
