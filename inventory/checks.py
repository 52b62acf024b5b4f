"""Inventory's settings, checked when a process starts rather than at the first sweep.

A bad ``LLMGW_PARTITION_*``, ``LLMGW_FLAP*``, ``LLMGW_HEALTH_*`` or ``LLMGW_REPORT_MIN_INTERVAL_S`` value is
read by every reachability sweep (every 5 s), every reconcile or every report, a bad ``LLMGW_NODE_NETWORKS``
or ``LLMGW_TRUSTED_PROXIES`` by every report that moves a node's address; as a Django system check
(tag ``llmgw-config``, as placement's) it stops ``llmgw serve`` at start with
the sentence naming the variable.
"""

from __future__ import annotations

from django.core import checks

from core.config import ConfigError
from inventory.loss_settings import health_settings, loss_rules, report_min_interval_s
from inventory.node_address import address_rules

TAG = "llmgw-config"


@checks.register(TAG)
def loss_settings(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    """An error naming the variable when node loss's settings cannot be used; nothing when they can."""
    try:
        loss_rules()
        health_settings()
        report_min_interval_s()
        address_rules()
    except ConfigError as exc:
        return [checks.Error(str(exc), id="inventory.E001")]
    return []
