"""Node loss's settings (partitions, the partition hold, flapping) and card health's, read in one place.

The reachability sweep, placement's snapshot (which keeps new replicas off a
flapping node) and the doctor's sweep all read them here, through
``core.config.number``, so a bad value is refused in the same words as every
other numeric setting — and at start, by the system check in
``inventory.checks``, rather than at every sweep.
"""

from __future__ import annotations

import os

from core.config import ConfigError, number
from inventory import failure_rules
from inventory import health_actions as A
from inventory.reachability import LossRules


def _whole(env: dict[str, str], name: str, default: int, low: int) -> int:
    value = number(env, name, default, low=low)
    if value != int(value):
        raise ConfigError(name, f"{env[name]!r} is not a whole number")
    return int(value)


def loss_rules(env: dict[str, str] | None = None) -> LossRules:
    """Partitions and flaps as the environment sets them (defaults and reasons: docs/operations.md, "Node loss")."""
    env = dict(os.environ if env is None else env)
    labels = env.get("LLMGW_PARTITION_LABELS", "rack")
    return LossRules(
        share=number(env, "LLMGW_PARTITION_SHARE", failure_rules.PARTITION_SHARE, low=0.0, high=1.0),
        window_s=number(env, "LLMGW_PARTITION_WINDOW_S", failure_rules.PARTITION_WINDOW_S, low=1.0),
        min_nodes=_whole(env, "LLMGW_PARTITION_MIN_NODES", failure_rules.PARTITION_MIN_NODES, 1),
        labels=tuple(x.strip() for x in labels.split(",") if x.strip()),
        hold_s=number(env, "LLMGW_PARTITION_HOLD_S", failure_rules.PARTITION_HOLD_S, low=0.0),
        flaps_to_cordon=_whole(env, "LLMGW_FLAPS_TO_CORDON", failure_rules.FLAPS_TO_CORDON, 0),
        flap_window_s=number(env, "LLMGW_FLAP_WINDOW_S", failure_rules.FLAP_WINDOW_S, low=1.0),
    )


def health_settings(env: dict[str, str] | None = None) -> A.Settings:
    """Card health's window, cordon threshold and clean window (defaults and reasons: docs/operations.md)."""
    env = dict(os.environ if env is None else env)
    return A.Settings(
        window_s=number(env, "LLMGW_HEALTH_WINDOW_S", A.WINDOW_S_DEFAULT, low=1.0),
        cordon_after=_whole(env, "LLMGW_HEALTH_CORDON_AFTER", A.CORDON_AFTER_DEFAULT, 1),
        clean_s=number(env, "LLMGW_HEALTH_CLEAN_S", A.CLEAN_S_DEFAULT, low=0.0),
        events_per_card=_whole(env, "LLMGW_HEALTH_EVENTS_PER_CARD", A.EVENTS_PER_CARD_DEFAULT, 1),
    )


# A node's full reports are taken at most once in this many seconds (changed or not; LLMGW_REPORT_MIN_INTERVAL_S).
# An agent reports every REPORT_INTERVAL_S and when discovery sees a change; one sending report after report
# (a card in an Xid storm, a hostile agent) would have every one ingested. 0 takes every report.
# One second: a change discovery sees is at most a second (and the agent's jitter) late on the live pages.
REPORT_MIN_INTERVAL_S_DEFAULT = 1.0


def report_min_interval_s(env: dict[str, str] | None = None) -> float:
    """How often a node's full reports are taken at most (agentapi.views.take_turn); 0: every one."""
    env = dict(os.environ if env is None else env)
    return number(env, "LLMGW_REPORT_MIN_INTERVAL_S", REPORT_MIN_INTERVAL_S_DEFAULT, low=0.0)
