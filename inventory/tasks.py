"""Periodic inventory work."""

from __future__ import annotations

import os

from celery import shared_task
from django.utils import timezone

from core.continuity import unbroken_since
from core.locks import exclusive
from core.runs import Run
from inventory import reachability, signals
from inventory.loss_settings import loss_rules
from inventory.models import Node
from inventory.writes import scans


def _seconds(name: str, default: float) -> float:
    return float(os.environ.get(name, default))


REACHABILITY = "inventory.tasks.check_reachability"


@shared_task(name=REACHABILITY, ignore_result=True, base=Run)
def check_reachability(every_s: float = 5.0) -> dict:
    """Mark silent nodes unreachable, then lost; safe to run twice, never twice at once.

    Nothing about nodes is passed in, so a run that finds its nodes already
    deleted just sees fewer nodes. ``every_s`` is the beat's period for it
    (llmgw.celery): a break in the sweeps' runs is one longer than the grace
    and than two periods, so a grace set shorter than the period does not
    make every ordinary pass look like one after a break (core.continuity).
    """
    with exclusive(REACHABILITY) as held:
        if not held:
            return {"skipped": "another worker holds the lock"}
        now = timezone.now()
        grace_s = _seconds("LLMGW_NODE_GRACE_S", reachability.GRACE_S)
        result = reachability.sweep(
            now,
            grace_s=grace_s,
            watching_since=unbroken_since(REACHABILITY, now, max(grace_s, 2 * every_s)),
            lost_after_s=_seconds("LLMGW_NODE_LOST_AFTER_S", reachability.LOST_AFTER_S),
            domain_lost_after_s=_seconds("LLMGW_DOMAIN_LOST_AFTER_S", reachability.DOMAIN_LOST_AFTER_S),
            rules=loss_rules(),
        )
    if result.changed:
        signals.reachability_changed.send(sender=Node, result=result)
    if result.judging_from is not None:
        return {"unreachable": 0, "lost": 0, "judging_from": result.judging_from.isoformat()}
    return {"unreachable": len(result.unreachable), "lost": len(result.lost)}


@shared_task(name="inventory.tasks.plan_scans", ignore_result=True, base=Run)
def plan_scans() -> dict:
    """Choose which node maps each due fabric; nodes pick their scan up with their next full report."""
    with exclusive("inventory.tasks.plan_scans") as held:
        if not held:
            return {"skipped": "another worker holds the lock"}
        return {"assigned": scans.plan_scans(timezone.now())}
