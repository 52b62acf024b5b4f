"""Cold starts as the stored fleet tells them: where a model's start stands, and how long starts have taken.

A start's estimate is placement.coldstart's (pure); here are its inputs,
read from the database (the replica's shards, their phases, the weights on
the nodes, the last starts of the same model and profile), and its view as
the API, the console and the gateway's waiting requests show it.
"""

from __future__ import annotations

import os
from collections import defaultdict
from typing import Any

from django.db.models import F, Window
from django.db.models.functions import RowNumber

from catalog.models import CatalogModel
from catalog.prefetch import holders as weight_holders
from catalog.prefetch import holders_of as weight_holders_of
from core.config import number
from placement.models import ColdStart, Replica, ReplicaState, Shard
from placement.scheduling import coldstart

# --- cold starts ----------------------------------------------------------------------

# How many recent starts of a model and profile the estimate reads (newest first).
SAMPLES = 50


def start_defaults(env: dict[str, str] | None = None) -> tuple[float, float]:
    """The engine load and the fetch assumed before anything was measured (LLMGW_COLD_START_DEFAULT_*_S)."""
    env = dict(os.environ if env is None else env)
    return (
        number(env, "LLMGW_COLD_START_DEFAULT_LOAD_S", coldstart.DEFAULT_LOAD_S, low=0.0, high=86400.0),
        number(env, "LLMGW_COLD_START_DEFAULT_FETCH_S", coldstart.DEFAULT_FETCH_S, low=0.0, high=86400.0),
    )


def start_samples(model_id: int, profile_name: str | None) -> list[coldstart.Sample]:
    """The model's recent measured starts (of one profile, or of any when None), newest first."""
    rows = ColdStart.objects.filter(model_id=model_id)
    if profile_name is not None:
        rows = rows.filter(profile_name=profile_name)
    return [
        coldstart.Sample(node, fetch_s, load_s, local)
        for node, fetch_s, load_s, local in rows.order_by("-at", "-id").values_list(
            "node", "fetch_s", "load_s", "weights_local"
        )[:SAMPLES]
    ]


def _progress(shard: Shard | None) -> coldstart.Progress:
    if shard is None:
        return coldstart.Progress("pending")
    phases = shard.phases or {}
    return coldstart.Progress(
        shard.state,
        fetch_s=float(phases.get("fetch_s") or 0.0),
        load_s=float(phases.get("load_s") or 0.0),
        bytes_done=shard.fetch_done,
        bytes_total=shard.fetch_total,
    )


def start_view(
    model: CatalogModel,
    replica: Replica | None,
    shard: Shard | None,
    samples: list[coldstart.Sample],
    held: set[str] | None = None,
) -> dict[str, Any]:
    """Where one replica's start stands (``shard`` its rank 0, None before it is placed) and what it should take.

    ``held``: the nodes holding the model's weights, when the caller has read them (else read here).
    """
    node = shard.node.name if shard else None
    progress = _progress(shard)
    local = (shard.phases or {}).get("weights_local") if shard else None
    if local is not None:
        holds = bool(local)  # the agent said, once its fetch was over
    else:
        held = weight_holders(model) if held is None else held
        holds = node in held if node else bool(held)
    load_default, fetch_default = start_defaults()
    est = coldstart.estimate(samples, node, holds, default_load_s=load_default, default_fetch_s=fetch_default)
    left = coldstart.remaining(est, progress)
    return {
        "model": model.name,
        "replica": replica.pk if replica else None,
        "node": node,
        "state": progress.state,
        "phases": dict(shard.phases) if shard and shard.phases else {},
        "estimate_s": round(est.total_s, 1),
        "estimate_fetch_s": round(est.fetch_s, 1),
        "estimate_load_s": round(est.load_s, 1),
        "measured": est.measured,
        "basis": est.basis,
        "remaining_s": round(left, 1),
        "sentence": coldstart.describe(model.name, node, progress, left),
    }


def cold_start(model_id: int) -> dict[str, Any] | None:
    """Where the model's start stands and how long it should still take; None for a model that is gone.

    The replica followed is the model's most advanced one not yet ready (its
    rank 0 shard); with none placed yet, the estimate is for any node. Read
    by the gateway while a request waits for a replica.
    """
    model = CatalogModel.objects.filter(pk=model_id).only("name", "source").first()
    if model is None:
        return None
    starting = (
        Replica.objects.filter(model_id=model_id, state__in=(ReplicaState.PENDING, ReplicaState.STARTING))
        .order_by("-state", "created_at")  # starting before pending, the oldest first
        .first()
    )
    shard = starting.shards.select_related("node").filter(rank=0).first() if starting else None
    samples = start_samples(model_id, starting.profile_name if starting else None)
    return start_view(model, starting, shard, samples)


def _starts(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The start view of each replica still starting, for the replica list (its values() rows, ``_LISTED``).

    Three queries for all of them together (their rank 0 shards, their
    models' recent starts, the nodes holding their weights), none when no
    replica is starting: a cold-start storm of hundreds of replicas must not
    make the list cost a query each.
    """
    starting = [r for r in rows if r["state"] in (ReplicaState.PENDING, ReplicaState.STARTING)]
    if not starting:
        return {}
    # The replicas and their models as .only() would build them from the rows read (the model's name
    # and source, all start_view reads of it), one model instance per model, without another query.
    db = Replica.objects.db
    models = {
        r["model_id"]: CatalogModel.from_db(
            db, ["id", "name", "source"], [r["model_id"], r["model__name"], r["model__source"]]
        )
        for r in starting
    }
    replicas = []
    for r in starting:
        replica = Replica.from_db(
            db, ["id", "model_id", "profile_name", "state"], [r["pk"], r["model_id"], r["profile_name"], r["state"]]
        )
        replica.model = models[r["model_id"]]
        replicas.append(replica)
    rank0 = {
        s.replica_id: s
        for s in Shard.objects.filter(replica__in=[r.pk for r in replicas], rank=0).select_related("node")
    }
    samples = _samples_of(set(models))
    held = weight_holders_of(models.values())
    return {
        r.pk: start_view(r.model, r, rank0.get(r.pk), samples.get((r.model_id, r.profile_name), []), held[r.model_id])
        for r in replicas
    }


def _samples_of(model_ids: set[int]) -> dict[tuple[int, str], list[coldstart.Sample]]:
    """:func:`start_samples` of every profile of these models, by (model id, profile): one query."""
    newest = Window(
        RowNumber(), partition_by=[F("model_id"), F("profile_name")], order_by=[F("at").desc(), F("id").desc()]
    )
    rows = (
        ColdStart.objects.filter(model_id__in=model_ids)
        .annotate(n=newest)
        .filter(n__lte=SAMPLES)
        .order_by("model_id", "profile_name", "n")
        .values_list("model_id", "profile_name", "node", "fetch_s", "load_s", "weights_local")
    )
    out: dict[tuple[int, str], list[coldstart.Sample]] = defaultdict(list)
    for model_id, profile, node, fetch_s, load_s, local in rows:
        out[(model_id, profile)].append(coldstart.Sample(node, fetch_s, load_s, local))
    return out
