"""The Celery app: broker from the environment, beat schedule as data.

Each periodic task's period can be overridden by an environment variable
(``LLMGW_EVERY_<NAME>`` in seconds), and each entry expires just under its
period so that a backlog never runs the same sweep twice in a row.
"""

from __future__ import annotations

import os

from celery import Celery
from celery.signals import (
    after_task_publish,
    task_postrun,
    task_prerun,
    task_received,
    worker_init,
    worker_process_init,
)
from kombu.transport import TRANSPORT_ALIASES

from core import memory, outage, tracing
from llmgw import worker_guard

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmgw.settings")
# The embedded broker's messages are written whole (see llmgw.broker).
TRANSPORT_ALIASES["filesystem"] = "llmgw.broker:Transport"

app = Celery("llmgw")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["observability", "inventory", "catalog", "placement", "dashboard", "gateway"])
# A worker that has gone quiet (its loop stuck, or deaf to its queue) exits for its supervisor to restart it.
app.steps["consumer"].add(worker_guard.Guard)

# name: (task, default period in seconds)
PERIODIC: dict[str, tuple[str, float]] = {
    "tick": ("observability.tasks.tick", 10.0),
    "reachability": ("inventory.tasks.check_reachability", 5.0),
    "plan_scans": ("inventory.tasks.plan_scans", 60.0),
    "doctor": ("observability.tasks.doctor_sweep", 60.0),
    "reconcile": ("placement.tasks.reconcile", 5.0),
    "catalog_file": ("catalog.tasks.load_catalog_file", 5.0),
    "reap_leases": ("gateway.tasks.reap_leases", 60.0),
}


TOLD_THEIR_PERIOD = frozenset({"reachability"})
"""Tasks handed their own period (``every_s``): the sweep tells a break in its runs from its ordinary pace by it."""


def beat_schedule(env: dict[str, str] | None = None) -> dict[str, dict]:
    env = dict(os.environ if env is None else env)
    schedule = {}
    for name, (task, default) in PERIODIC.items():
        every = float(env.get(f"LLMGW_EVERY_{name.upper()}", default))
        schedule[name] = {"task": task, "schedule": every, "options": {"expires": max(1.0, every * 0.9)}}
        if name in TOLD_THEIR_PERIOD:
            schedule[name]["kwargs"] = {"every_s": every}
    return schedule


app.conf.beat_schedule = beat_schedule()
# Each run the beat sends is confirmed begun, or sent again while it has not expired (llmgw.beat).
app.conf.beat_scheduler = "llmgw.beat:Scheduler"


@worker_init.connect
@worker_process_init.connect
def _start_tracing(**_) -> None:
    """Each worker process traces on its own: the pool's children are forked, and set up again after the fork."""
    tracing.setup("llmgw-worker")


@after_task_publish.connect
@task_received.connect
@task_prerun.connect
def _broker_answered(**_) -> None:
    """A task was queued (a caller, the beat), received (a worker's consumer) or handed to a worker's process
    to run: the broker is there (core.outage)."""
    outage.redis.back()


@task_postrun.connect
def _give_back_freed_memory(**_) -> None:
    """After each task, the allocator's free pages go back to the system (core.memory): a process that ran a
    fleet-wide task would otherwise keep what it freed, some 50 MB at 10,000 nodes."""
    memory.give_back()
