"""The reconciler's start deadline: a replica not ready long after it was placed is failed, so another is placed.

Each pass, before the plan (placement/writes/reconciler.py):

1. The replicas still ``pending`` or ``starting`` and placed longer ago than
   the deadline's floor are read: a younger one cannot be overdue, so a
   fleet where every start is on time costs one indexed query.
2. For those, what the deadline follows is read (three queries, whatever
   their number): the model's weights' size (the largest any download,
   prefetch or one of the replica's shards said), each node's measured
   download rate and the fleet's (the ``ColdStart`` rows' bytes over their
   fetch seconds), and the model's measured starts (the cold-start estimate's).
3. The pure rule (placement.scheduling.startdeadline) gives each its
   deadline; one past it becomes ``failed`` with the sentence as its error,
   counted as a failed start (``failure_streak``: a model that never starts
   is parked like one that crashes), written to the audit log and to its
   model's explanation (``PlacementExplanation.start_timeouts``).
4. The plan in the same pass stops it, freeing its GPUs, and places another
   where the model still wants one. The agent, if it is alive, hears at its
   next heartbeat that the shard is no longer wanted and stops it.

The failing UPDATE is conditional on the state read, so a replica its agent
reported ready meanwhile is left alone.
"""

from __future__ import annotations

import os
from collections import defaultdict
from datetime import datetime, timedelta

from django.db.models import F, Max

from catalog.models import CatalogModel, WeightPrefetch
from catalog.prefetch import holders as weight_holders
from core.config import number
from core.models import AuditEntry
from placement.models import ColdStart, PlacementExplanation, Replica, ReplicaState
from placement.scheduling import coldstart, startdeadline
from placement.scheduling.startdeadline import Deadline, Known, NodeFetch, Policy
from placement.starts import start_defaults, start_samples

ACTOR = "reconciler"
NOT_READY = (ReplicaState.PENDING, ReplicaState.STARTING)
# The measured downloads a node's rate (and the fleet's) is the median of: the newest, any model's.
RATE_SAMPLES = 500
# The start timeouts an explanation keeps, newest first.
KEEP_TIMEOUTS = 5


def policy(env: dict[str, str] | None = None) -> Policy:
    """The deadline's knobs from the environment (LLMGW_START_DEADLINE_*), each with its default."""
    env = dict(os.environ if env is None else env)
    floor = number(env, "LLMGW_START_DEADLINE_FLOOR_S", startdeadline.FLOOR_S, low=1.0, high=7 * 86400.0)
    cap = number(env, "LLMGW_START_DEADLINE_CAP_S", max(floor, startdeadline.CAP_S), low=floor, high=30 * 86400.0)
    slack = number(env, "LLMGW_START_DEADLINE_SLACK", startdeadline.SLACK, low=1.0, high=100.0)
    return Policy(floor_s=floor, cap_s=cap, slack=slack)


def fail_overdue(now: datetime) -> list[str]:
    """Fail every replica past its start deadline (see the module docstring); the ids failed."""
    knobs = policy()
    old = list(
        Replica.objects.filter(state__in=NOT_READY, created_at__lt=now - timedelta(seconds=knobs.floor_s))
        .select_related("model")
        .prefetch_related("shards__node")
        .order_by("created_at", "id")
    )
    if not old:
        return []
    sizes = _sizes({r.model_id for r in old})
    node_rates, fleet_rate = _rates()
    failed = []
    for r in old:
        limit = _deadline(r, sizes, node_rates, fleet_rate, knobs)
        if startdeadline.overdue(r.created_at, now, limit) and _fail(r, now, limit):
            failed.append(r.id)
    return failed


def _sizes(model_ids: set[int]) -> dict[int, int]:
    """Each model's weights' size in bytes: the largest a measured download or a prefetch said."""
    out: dict[int, int] = defaultdict(int)
    downloads = ColdStart.objects.filter(model_id__in=model_ids, fetch_bytes__gt=0).values("model_id")
    prefetches = WeightPrefetch.objects.filter(model_id__in=model_ids, bytes_total__gt=0).values("model_id")
    for rows, column in ((downloads, "fetch_bytes"), (prefetches, "bytes_total")):
        for model_id, size in rows.annotate(size=Max(column)).values_list("model_id", "size"):
            out[model_id] = max(out[model_id], size)
    return dict(out)


def _rates() -> tuple[dict[str, float], float | None]:
    """Each node's measured download rate (bytes/s) and the fleet's, from the newest measured downloads."""
    rows = list(
        ColdStart.objects.filter(weights_local=False, fetch_bytes__gt=0, fetch_s__gt=0)
        .order_by("-at", "-id")
        .values_list("node", "fetch_bytes", "fetch_s")[:RATE_SAMPLES]
    )
    by_node: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for node, size, seconds in rows:
        by_node[node].append((size, seconds))
    rates = {node: startdeadline.rate(samples) for node, samples in by_node.items()}
    return {n: r for n, r in rates.items() if r}, startdeadline.rate((b, s) for _, b, s in rows)


def _deadline(
    r: Replica, sizes: dict[int, int], node_rates: dict[str, float], fleet_rate: float | None, knobs: Policy
) -> Deadline:
    shards = list(r.shards.all())
    size = max([sizes.get(r.model_id, 0)] + [s.fetch_total or 0 for s in shards]) or None
    load_default, fetch_default = start_defaults()
    # The cold-start estimate's own figures, so the deadline and the wait a client is told agree.
    samples = start_samples(r.model_id, r.profile_name)
    est = coldstart.estimate(
        samples,
        None,
        False,
        default_load_s=load_default,
        default_fetch_s=fetch_default,
    )
    held = weight_holders(r.model)
    ranked = sorted(shards, key=lambda s: s.rank)
    nodes = [NodeFetch(s.node.name, _holds(s, held), node_rates.get(s.node.name)) for s in ranked]
    known = Known(
        size_bytes=size,
        fleet_rate_bps=fleet_rate,
        measured_fetch_s=est.fetch_s if est.measured else None,
        default_fetch_s=fetch_default,
        load_s=est.load_s,
        # The estimate's basis starts with what its load comes from ("load: median of 3 start(s) …").
        load_basis=est.basis.split(";")[0].removeprefix("load: ") if samples else "the default",
    )
    return startdeadline.deadline(nodes, known, knobs)


def _holds(shard, held: set[str]) -> bool:
    local = (shard.phases or {}).get("weights_local") if isinstance(shard.phases, dict) else None
    return bool(local) if local is not None else shard.node.name in held


def _fail(r: Replica, now: datetime, limit: Deadline) -> bool:
    """Mark ``r`` failed for its deadline, if it is still not ready; whether it was."""
    nodes = sorted({s.node.name for s in r.shards.all()})
    waited = (now - r.created_at).total_seconds()
    why = startdeadline.sentence(r.id, nodes, waited, limit)
    if Replica.objects.filter(pk=r.pk, state=r.state).update(state=ReplicaState.FAILED, error=why) != 1:
        return False
    CatalogModel.objects.filter(pk=r.model_id).update(failure_streak=F("failure_streak") + 1)
    detail = {"replica": r.id, "nodes": nodes, "waited_s": round(waited), "deadline_s": round(limit.seconds)}
    AuditEntry.record(ACTOR, "start-timeout", f"{r.model.name}#{r.id}", {**detail, "reason": why})
    explanation, _ = PlacementExplanation.objects.get_or_create(model_id=r.model_id, defaults={"computed_at": now})
    entry = {**detail, "at": now.isoformat(), "reason": why}
    explanation.start_timeouts = [entry, *(explanation.start_timeouts or [])][:KEEP_TIMEOUTS]
    explanation.save(update_fields=["start_timeouts"])
    return True
