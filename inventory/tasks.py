"""Periodic inventory work."""

from __future__ import annotations

import os

from celery import shared_task
from django.utils import timezone

from core.locks import exclusive
from inventory import failure_rules, reachability, signals
from inventory.models import Node
from inventory.writes import scans


def _seconds(name: str, default: float) -> float:
    return float(os.environ.get(name, default))


def _number(name: str, default: float, kind: type = float) -> float:
    """An LLMGW_* number; one that does not read as a number is the default (a typo must not stop the sweep)."""
    try:
        return kind(os.environ.get(name, default))
    except ValueError:
        return default


def loss_rules() -> reachability.LossRules:
    """Partitions and flaps as the environment sets them (defaults and reasons: docs/operations.md, "Node loss")."""
    labels = os.environ.get("LLMGW_PARTITION_LABELS", "rack")
    return reachability.LossRules(
        share=_number("LLMGW_PARTITION_SHARE", failure_rules.PARTITION_SHARE),
        window_s=_number("LLMGW_PARTITION_WINDOW_S", failure_rules.PARTITION_WINDOW_S),
        min_nodes=int(_number("LLMGW_PARTITION_MIN_NODES", failure_rules.PARTITION_MIN_NODES, int)),
        labels=tuple(x.strip() for x in labels.split(",") if x.strip()),
        flaps_to_cordon=int(_number("LLMGW_FLAPS_TO_CORDON", failure_rules.FLAPS_TO_CORDON, int)),
        flap_window_s=_number("LLMGW_FLAP_WINDOW_S", failure_rules.FLAP_WINDOW_S),
    )


@shared_task(name="inventory.tasks.check_reachability", ignore_result=True)
def check_reachability() -> dict:
    """Mark silent nodes unreachable, then lost; safe to run twice, never twice at once.

    Nothing is passed in, so a run that finds its nodes already deleted just
    sees fewer nodes.
    """
    with exclusive("inventory.tasks.check_reachability") as held:
        if not held:
            return {"skipped": "another worker holds the lock"}
        result = reachability.sweep(
            timezone.now(),
            grace_s=_seconds("LLMGW_NODE_GRACE_S", reachability.GRACE_S),
            lost_after_s=_seconds("LLMGW_NODE_LOST_AFTER_S", reachability.LOST_AFTER_S),
            domain_lost_after_s=_seconds("LLMGW_DOMAIN_LOST_AFTER_S", reachability.DOMAIN_LOST_AFTER_S),
            rules=loss_rules(),
        )
    if result.changed:
        signals.reachability_changed.send(sender=Node, result=result)
    return {"unreachable": len(result.unreachable), "lost": len(result.lost)}


@shared_task(name="inventory.tasks.plan_scans", ignore_result=True)
def plan_scans() -> dict:
    """Choose which node maps each due fabric; nodes pick their scan up with their next full report."""
    with exclusive("inventory.tasks.plan_scans") as held:
        if not held:
            return {"skipped": "another worker holds the lock"}
        return {"assigned": scans.plan_scans(timezone.now())}
