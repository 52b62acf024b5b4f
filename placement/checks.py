"""Placement's settings, checked when a process starts rather than at the first reconcile.

A bad ``LLMGW_AUTOSCALE_*`` value is read by every reconcile; left to them it
would fail each one, every few seconds, in a worker's log. As a Django system
check (tag ``llmgw-config``) it stops ``llmgw serve`` at start with the
sentence, and ``llmgw check`` says it too.
"""

from __future__ import annotations

from django.core import checks

from core.config import ConfigError
from placement.writes import autoscaling

TAG = "llmgw-config"


@checks.register(TAG)
def autoscale_settings(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    """An error naming the variable when the autoscaler's settings cannot be used; nothing when they can."""
    try:
        autoscaling.enabled()
        autoscaling.policy()
    except ConfigError as exc:
        return [checks.Error(str(exc), id="placement.E001")]
    return []
