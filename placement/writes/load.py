"""The fleet's load per model, as every gateway worker reports it: where it is kept and how it is summed.

The design, the simplest that sees every host's traffic:

- Each gateway worker counts, per model, its requests in flight, those
  waiting for a replica, the completion tokens per second and the mean time
  to the first token of what ended in the last ten seconds
  (``gateway.load``), and publishes them every second as one Redis hash per
  worker (``llmgw:load:<worker>``, a field per model) that expires after
  ``LOAD_TTL_S``: a worker that dies drops out by itself.
- When Redis is not configured or does not answer, the worker writes the
  same figures to ``LoadReport`` rows instead (:func:`store`), and deletes
  them once Redis answers again (:func:`forget`).
- The autoscaler (:func:`fleet`) sums the live workers: Redis's hashes and
  the rows younger than ``LOAD_TTL_S``, taking each worker's newest report
  once, so a worker that just switched stores is not counted twice. Redis
  down, it reads the rows alone, and says so.

Leases (``gateway.writes.leases``) were not used for in-flight counts: they
are per budget, not per model, and a free model holds none.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import redis
from django.db import transaction

from placement.models import LoadReport
from placement.scheduling.autoscale import Load

log = logging.getLogger(__name__)

KEY_PREFIX = "llmgw:load:"
# A worker publishes every second; three missed in a row and it counts for nothing.
LOAD_TTL_S = 5.0
FIELDS = ("in_flight", "waiting", "tokens_per_s", "ttft_ms")


def redis_key(owner: str) -> str:
    return KEY_PREFIX + owner


def encode(report: Mapping[str, Mapping[str, Any]], at: float) -> dict[str, str]:
    """A worker's report as its Redis hash: model name → its figures as JSON, with the time (epoch seconds)."""
    return {model: json.dumps({**{k: figures.get(k) for k in FIELDS}, "at": at}) for model, figures in report.items()}


def store(owner: str, report: Mapping[str, Mapping[str, Any]], now: datetime) -> None:
    """Keep a worker's report in the database (Redis down): its models' rows now, and none for the others."""
    with transaction.atomic():
        LoadReport.objects.filter(owner=owner).exclude(model_name__in=list(report)).delete()
        for model, figures in report.items():
            LoadReport.objects.update_or_create(
                owner=owner,
                model_name=model[:128],
                defaults={
                    "in_flight": max(0, int(figures.get("in_flight") or 0)),
                    "waiting": max(0, int(figures.get("waiting") or 0)),
                    "tokens_per_s": _number(figures.get("tokens_per_s")) or 0.0,
                    "ttft_ms": _number(figures.get("ttft_ms")),
                    "reported_at": now,
                },
            )


def forget(owner: str) -> None:
    """The worker reports to Redis again, or stops: its rows go."""
    LoadReport.objects.filter(owner=owner).delete()


@dataclass
class FleetLoad:
    """Every model's load summed over the live workers, and where it was read."""

    by_model: dict[str, Load] = field(default_factory=dict)
    source: str = "none"
    """``redis``, ``database``, ``redis+database`` (some workers on each), or ``none`` (no worker reported)."""
    problem: str = ""
    """Why Redis was not read, when it was configured but did not answer."""

    def of(self, model: str) -> Load:
        return self.by_model.get(model, Load())


def fleet(now: datetime, redis_url: str | None) -> FleetLoad:
    """The load on every model now: Redis's live hashes and the database's fresh rows, each worker once."""
    reports: dict[str, tuple[float, dict[str, dict]]] = {}
    problem, from_redis = "", False
    if redis_url:
        try:
            for owner, at, models in _from_redis(redis_url):
                reports[owner] = (at, models)
            from_redis = True
        except Exception as exc:  # noqa: BLE001 - any Redis failure: the database's rows are the load
            problem = f"Redis did not answer ({exc}); the load is read from the database"
            log.warning("autoscaler: %s", problem)
    in_db = False
    for owner, at, models in _from_database(now):
        in_db = True
        if owner not in reports or reports[owner][0] < at:
            reports[owner] = (at, models)
    source = "+".join(s for s, on in (("redis", from_redis and bool(reports)), ("database", in_db)) if on) or "none"
    return FleetLoad(_sum(reports), source, problem)


def _from_redis(url: str) -> list[tuple[str, float, dict[str, dict]]]:
    client = redis.Redis.from_url(url, socket_timeout=1.0, socket_connect_timeout=1.0)
    try:
        keys = sorted(client.scan_iter(match=KEY_PREFIX + "*", count=500))
        if not keys:
            return []
        pipe = client.pipeline(transaction=False)
        for key in keys:
            pipe.hgetall(key)
        out = []
        for key, fields in zip(keys, pipe.execute(), strict=True):
            owner = key.decode(errors="replace").removeprefix(KEY_PREFIX)
            models, newest = {}, 0.0
            for name, raw in fields.items():
                figures = _decode(raw)
                if figures is not None:
                    models[name.decode(errors="replace")] = figures
                    newest = max(newest, _number(figures.get("at")) or 0.0)
            out.append((owner, newest, models))
        return out
    finally:
        client.close()


def _from_database(now: datetime) -> list[tuple[str, float, dict[str, dict]]]:
    by_owner: dict[str, tuple[float, dict[str, dict]]] = {}
    fresh = LoadReport.objects.filter(reported_at__gte=now - timedelta(seconds=LOAD_TTL_S))
    for row in fresh.order_by("owner", "model_name"):
        at, models = by_owner.get(row.owner, (0.0, {}))
        models[row.model_name] = {k: getattr(row, k) for k in FIELDS}
        by_owner[row.owner] = (max(at, row.reported_at.timestamp()), models)
    return [(owner, at, models) for owner, (at, models) in by_owner.items()]


def _decode(raw: bytes) -> dict | None:
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def _sum(reports: Mapping[str, tuple[float, dict[str, dict]]]) -> dict[str, Load]:
    """Per model: in flight, waiting and tokens/s summed; time to first token averaged over the workers that had one."""
    totals: dict[str, list] = {}
    for _at, models in reports.values():
        for name, f in models.items():
            t = totals.setdefault(name, [0, 0, 0.0, [], 0])
            t[0] += max(0, int(_number(f.get("in_flight")) or 0))
            t[1] += max(0, int(_number(f.get("waiting")) or 0))
            t[2] += max(0.0, _number(f.get("tokens_per_s")) or 0.0)
            ttft = _number(f.get("ttft_ms"))
            if ttft is not None:
                t[3].append(ttft)
            t[4] += 1
    return {
        name: Load(
            in_flight=t[0],
            waiting=t[1],
            tokens_per_s=t[2],
            ttft_ms=sum(t[3]) / len(t[3]) if t[3] else None,
            workers=t[4],
        )
        for name, t in totals.items()
    }
