"""The whole fleet in one answer: ``GET /api/v1/summary``, ``ctl status`` and the console's front page.

A per-node table is the right tool for four nodes and the wrong one for two
thousand: the questions that matter at that size — how full am I, what is
broken, what holds cards it is not using — are aggregates. Everything here is
derived from the same functions the tables use (``node_list``,
``replica_list``, and ``model_standing``, which a test holds equal to
``model_list``'s entries): counted in the database (``fleet_sql``), which
tests hold to those lists on the same fleet (tests/observability/summary_spec.py). The devices by class are
the inventory's one count (:func:`gpu_counts`), which ``/metrics`` reads too.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta
from typing import Any

import httpx
from django.utils import timezone

from inventory.reads.gpu_counts import DeviceCounts, device_counts
from inventory.reads.partitions import active as active_partitions
from observability import fleet_sql
from placement.reads import gpu_holders, model_standing

# How long a ready replica must go unasked-for to be named. Minutes, not
# seconds: one that flaps in and out of the list is noise, and unloading a
# replica throws away the KV cache prefix routing worked to fill.
IDLE_THRESHOLD = timedelta(minutes=10)

PATRONI_TIMEOUT_S = 1.0


def summary(now: datetime | None = None) -> dict[str, Any]:
    """The summary, counted in the database (see ``fleet_sql``)."""
    now = now or timezone.now()
    devices = gpu_counts()
    out: dict[str, Any] = {
        "nodes": fleet_sql.node_totals(),
        "gpus": devices.classes,
        "fabrics": fleet_sql.fabrics(devices.free_nodes),
        "replicas": fleet_sql.replica_totals(),
        "idle_replicas": fleet_sql.idle_replicas(now, IDLE_THRESHOLD),
    }
    out.update(_model_totals(model_standing()))
    # Open partitions: moves off their nodes are held until they answer or `ctl resume-moves`.
    out["partitions"] = active_partitions()
    store = store_members()
    if store is not None:
        out.update(store)
    return out


def gpu_counts(*, free_nodes: bool = True) -> DeviceCounts:
    """The fleet's devices by class (and the nodes entirely free), as the summary and ``/metrics`` both count them.

    Counted by the inventory (``inventory.reads.gpu_counts``), with the GPUs placement's shards hold.
    """
    return device_counts(gpu_holders(), free_nodes=free_nodes)


def _model_totals(models: list[dict]) -> dict[str, Any]:
    """Satisfied or short; the short ones that cannot be placed named, and the parked ones with their error.

    Against what the scheduler last said as well as the minimum: an on-demand
    model's minimum is 0, so one that was asked for and fits nowhere would
    otherwise count as satisfied.
    """
    totals = {"total": len(models), "satisfied": 0, "short": 0}
    unplaceable, parked = [], []
    for m in models:
        if m["parked"]:
            parked.append({"model": m["name"], "failures": m.get("failures", 0), "reason": m.get("parked_error", "")})
        short = m["parked"] or m["unplaceable"] or m["ready_replicas"] < m["min_replicas"]
        if not short:
            totals["satisfied"] += 1
            continue
        totals["short"] += 1
        # Short and unable to place more is the actionable case; short and
        # still starting is a cluster doing its job.
        if m["unplaceable"] or (not m["parked"] and m["total_replicas"] < m["min_replicas"]):
            unplaceable.append(m["name"])
    return {"models": totals, "unplaceable": sorted(unplaceable), "parked": parked}


def store_members() -> dict[str, Any] | None:
    """The members of a replicated PostgreSQL, from Patroni's REST API; None when none is configured.

    ``lag`` is bytes behind the leader: 0 for the leader, -1 when Patroni
    does not know. When Patroni cannot be read, ``store_error`` says why and
    the rest of the summary is still answered.
    """
    url = os.environ.get("LLMGW_PATRONI_URL", "").strip()
    if not url:
        return None
    try:
        answer = httpx.get(url.rstrip("/") + "/cluster", timeout=PATRONI_TIMEOUT_S)
        answer.raise_for_status()
        members = answer.json().get("members", [])
    except (httpx.HTTPError, ValueError, AttributeError) as exc:
        return {"store": [], "store_error": f"Patroni at {url} could not be read: {exc}"}
    return {"store": [_member(m) for m in members if isinstance(m, dict)]}


def _member(m: dict) -> dict[str, Any]:
    lag = m.get("lag")
    if m.get("role") in ("leader", "master", "standby_leader"):
        lag = 0
    return {
        "name": str(m.get("name", "")),
        "host": str(m.get("host", "")),
        "role": str(m.get("role", "")),
        "state": str(m.get("state", "")),
        "lag": lag if isinstance(lag, int) and not isinstance(lag, bool) else -1,
    }
