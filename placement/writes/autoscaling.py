"""The reconciler's autoscaling step: each model's desired count from the fleet's load, decided and recorded.

For every model with ``max > min`` (and not parked): the load summed over
every gateway worker (``placement.writes.load``), one replica's capacity on
the profile its replicas run (or its first profile), the replicas it has,
and the history kept in its ``Autoscale`` row go to the pure decision
(``placement.scheduling.autoscale.decide``). The row is written with the
decision and the figures it was taken from; a change of the desired count
also writes a ``ScaleEvent`` and an audit entry, both with the reason in
numbers. The scheduler gets the count (``ModelInfo.scale_to``) and places
up to it, or stops one replica above it, the least used.

``LLMGW_AUTOSCALE=off`` turns it off: models then run ``min`` (plus demand)
as before, and the rows are left as they were.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime

from django.conf import settings
from django.db.models import F

from catalog.models import CapacityMeasurement, CatalogModel
from core.config import ConfigError, number
from core.models import AuditEntry
from core.vanished import unless_gone
from placement.models import Autoscale, Replica, ReplicaState, ScaleEvent
from placement.scheduling.autoscale import HOLD, Decision, History, Policy, capacity_from, decide
from placement.writes.load import FleetLoad, fleet

ACTOR = "reconciler"
COUNTING = (ReplicaState.PENDING, ReplicaState.STARTING, ReplicaState.READY)


@dataclass
class Scaling:
    """What the step decided: per model, the count and the reason; and which models' count changed."""

    desired: dict[str, tuple[int, str]] = field(default_factory=dict)
    changed: list[str] = field(default_factory=list)
    load: FleetLoad = field(default_factory=FleetLoad)


def enabled(env: dict[str, str] | None = None) -> bool:
    raw = (os.environ if env is None else env).get("LLMGW_AUTOSCALE", "on").strip().lower()
    return raw not in ("off", "0", "false", "no")


def _env_number(env: dict[str, str], name: str, default: float, low: float, high: float) -> float:
    return number(env, name, default, low=low, high=high)


def policy(env: dict[str, str] | None = None) -> Policy:
    """The knobs from the environment (``LLMGW_AUTOSCALE_*``), each with its default."""
    env = dict(os.environ if env is None else env)
    target = _env_number(env, "LLMGW_AUTOSCALE_TARGET", 0.8, 0.05, 1.0)
    down = _env_number(env, "LLMGW_AUTOSCALE_DOWN", min(0.6, target * 0.75), 0.01, target)
    if down >= target:
        raise ConfigError("LLMGW_AUTOSCALE_DOWN", f"{down:g} must be below LLMGW_AUTOSCALE_TARGET ({target:g})")
    return Policy(
        target_share=target,
        down_share=down,
        up_window_s=_env_number(env, "LLMGW_AUTOSCALE_UP_WINDOW_S", 15.0, 0.0, 3600.0),
        cooldown_s=_env_number(env, "LLMGW_AUTOSCALE_COOLDOWN_S", 300.0, 0.0, 86400.0),
        default_concurrency=int(_env_number(env, "LLMGW_AUTOSCALE_DEFAULT_CONCURRENCY", 8, 1, 100000)),
    )


def autoscale(now: datetime, vanished: list[str] | None = None) -> Scaling:
    """Decide every autoscaled model's count, record it, and return it for the scheduler.

    A model deleted while this runs is not recorded, and is named in ``vanished`` (``core.vanished``).
    """
    vanished = [] if vanished is None else vanished
    out = Scaling()
    if not enabled():
        return out
    models = list(
        CatalogModel.objects.filter(max_replicas__gt=F("min_replicas"), parked_at__isnull=True)
        .prefetch_related("profiles")
        .order_by("name")
    )
    if not models:
        return out
    knobs = policy()
    out.load = fleet(now, getattr(settings, "LLMGW_REDIS_URL", None))
    live, profiles = _replicas([m.pk for m in models])
    measured = {
        (c.model_name, c.profile_name): c.measurement
        for c in CapacityMeasurement.objects.filter(model_name__in=[m.name for m in models])
    }
    rows = {a.model_id: a for a in Autoscale.objects.filter(model_id__in=[m.pk for m in models])}
    for m in models:
        profile_name = profiles.get(m.pk) or _first_profile(m)
        capacity = capacity_from(profile_name, measured.get((m.name, profile_name)), knobs)
        row = rows.get(m.pk)
        history = (
            History(row.desired, row.changed_at, row.above_since, row.below_since) if row is not None else History()
        )
        d = decide(
            min_replicas=m.min_replicas,
            max_replicas=m.max_replicas,
            idle_timeout_s=m.idle_timeout.total_seconds() if m.idle_timeout is not None else None,
            live=live.get(m.pk, 0),
            load=out.load.of(m.name),
            capacity=capacity,
            history=history,
            now=now,
            policy=knobs,
        )
        # Never decided before: what the model ran, at least its minimum (placing that is no scaling).
        before = row.desired if row is not None else min(max(live.get(m.pk, 0), m.min_replicas), m.max_replicas)
        with unless_gone(f"autoscaling of {m.name}", vanished):
            _record(m, row, d, before, capacity, live.get(m.pk, 0), out.load, now)
        if d.desired != before:
            out.changed.append(m.name)
        out.desired[m.name] = (d.desired, d.reason)
    return out


def _first_profile(m: CatalogModel) -> str:
    ordered = sorted(m.profiles.all(), key=lambda p: (p.position, p.name))
    return ordered[0].name if ordered else ""


def _replicas(model_ids: list[int]) -> tuple[dict[int, int], dict[int, str]]:
    """Per model: replicas that count (a replica and its replacement once), and the profile most of them run."""
    rows = list(
        Replica.objects.filter(model_id__in=model_ids, state__in=COUNTING).values_list(
            "id", "model_id", "profile_name", "replaces_id"
        )
    )
    ids = {r[0] for r in rows}
    counts: Counter[int] = Counter()
    used: dict[int, Counter[str]] = {}
    for _rid, model_id, profile, replaces in rows:
        used.setdefault(model_id, Counter())[profile] += 1
        if replaces not in ids:
            counts[model_id] += 1
    return dict(counts), {k: c.most_common(1)[0][0] for k, c in used.items()}


def _record(m, row, d: Decision, before: int, capacity, live: int, load: FleetLoad, now: datetime) -> None:
    figures = load.of(m.name)
    values = {
        "desired": d.desired,
        "direction": d.direction,
        "reason": d.reason,
        "decided_at": now,
        "changed_at": d.history.changed_at,
        "above_since": d.history.above_since,
        "below_since": d.history.below_since,
        "replicas": live,
        "in_flight": figures.in_flight,
        "waiting": figures.waiting,
        "tokens_per_s": figures.tokens_per_s,
        "ttft_ms": figures.ttft_ms,
        "workers": figures.workers,
        "load_source": load.source,
        "capacity_profile": capacity.profile[:64],
        "capacity_concurrency": capacity.concurrency,
        "capacity_tokens_per_s": capacity.tokens_per_s,
        "capacity_measured": capacity.measured,
    }
    Autoscale.objects.update_or_create(model=m, defaults=values)
    if d.desired == before:
        return
    # A change that is neither step: the count taken to the replicas left, or into new bounds; it stops nothing.
    direction = d.direction if d.direction != HOLD else "settle"
    ScaleEvent.objects.create(
        model=m, at=now, from_replicas=before, to_replicas=d.desired, direction=direction, reason=d.reason
    )
    detail = {"from": before, "to": d.desired, "reason": d.reason, "load_source": load.source}
    if load.problem:
        detail["problem"] = load.problem
    AuditEntry.record(ACTOR, f"scale-{direction}", m.name, detail)
