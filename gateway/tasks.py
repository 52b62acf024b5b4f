"""The gateway's Celery tasks."""

from __future__ import annotations

from celery import shared_task
from django.utils import timezone

from core.locks import exclusive
from core.runs import Run
from gateway.writes import leases

REAP_LEASES = "gateway.tasks.reap_leases"


@shared_task(name=REAP_LEASES, ignore_result=True, base=Run)
def reap_leases() -> dict:
    """Give back the reservations of gateway processes that stopped renewing their leases (gateway.writes.leases).

    Under a lock: a second worker that finds it held skips this run. Nothing
    is passed in: a budget deleted since took its leases with it.
    """
    with exclusive(REAP_LEASES) as held:
        if not held:
            return {"skipped": "another worker holds the lock"}
        reaped = leases.reap(timezone.now())
    return {"leases": reaped.leases, "budgets": reaped.budgets, "micros": reaped.micros}
