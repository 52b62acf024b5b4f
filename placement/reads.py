"""What the API and the console show of placement: replicas, explanations, and models and nodes with theirs.

Both call these functions, so the two never disagree. A key left out means
unknown. ``idle_seconds`` is -1 for a replica no request has been routed to
yet: that is what a replica looks like before anything asked for it (and
after a router restart), which is not the same as idle.

Models and nodes are listed here because the listings join placement's rows;
the catalog's and the inventory's parts of each entry are built by their own
reads, which are handed what placement read.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

from django.db.models import Count, Q, QuerySet
from django.utils import timezone

from catalog.models import CatalogModel
from catalog.reads import model_rows, model_view
from core import cycles, dbtimes
from core.jsonrows import DecodedOnce, values_decoded_once, values_list_as_text
from inventory.devices import held_indices, mig_label
from inventory.models import Node, NVLinkDomain
from inventory.reads import node_listing
from inventory.reads import nodes as inventory_nodes
from inventory.reads import tiles as inventory_tiles
from inventory.reads.nodes import NodeUsage
from placement.models import Autoscale, PlacementExplanation, Replica, ReplicaState, ScaleEvent, Shard
from placement.starts import _starts

# Replicas that are serving or on their way to: what counts toward a model's replicas.
COUNTING = (ReplicaState.PENDING, ReplicaState.STARTING, ReplicaState.READY)


def gpu_holders() -> QuerySet:
    """Rows (node id, GPU indices) of every shard: what holds GPUs, for the inventory's counts of them.

    Every shard holds its GPUs, failed and stopping ones too: their processes
    may keep the memory until the agent has stopped them.
    """
    return Shard.objects.order_by().values_list("node_id", "gpu_indices")


# What the replica list reads of each replica, as values() rows: building a Replica, and its model,
# profile and NVLink domain, for each of thousands of replicas was most of the list's time at
# 10,000 nodes. A starting replica's start view reads the model's name and source, as cold_start does.
# Its two times are read as microseconds (core.dbtimes): the list only says how long ago they were.
_LISTED = (
    "pk",
    "model_id",
    "model__name",
    "model__source",
    "profile_id",
    "profile_name",
    "profile_fingerprint",
    "profile__fingerprint",
    "state",
    "pool",
    "fabric",
    "nvlink_domain_id",
    "nvlink_domain__cluster_uuid",
    "nvlink_domain__clique_id",
    "endpoint",
    "error",
    "replaces_id",
    "created_us",
    "last_used_us",
)
_SHARD_LISTED = (
    "replica_id",
    "node_id",
    "node__name",
    "rank",
    "gpu_indices",
    "state",
    "error",
    "fetch_source",
    "fetch_done",
    "fetch_total",
    "phases",
)
_SHARD_JSON = ("gpu_indices", "phases")
# A shard in these states shows a download (fetch_view): only for them is what an agent reported read.
_FETCHING = ("pending", "fetching")


def replica_list(model: str | None = None, now: datetime | None = None) -> list[dict[str, Any]]:
    """Every replica (or one model's) with its shards and any download in flight."""
    with cycles.uncollected():
        return _replica_list(model, now or timezone.now())


def _replica_list(model: str | None, now: datetime) -> list[dict[str, Any]]:
    replicas = dbtimes.with_microseconds(
        Replica.objects.order_by("model__name", "created_at"), created_us="created_at", last_used_us="last_used_at"
    )
    if model:
        replicas = replicas.filter(model__name=model)
    rows = list(replicas.values(*_LISTED))
    shards: dict[str, list[dict]] = defaultdict(list)
    # The shards in any order (each replica's are sorted by rank below), each distinct JSON value of
    # their GPU indices and phases decoded once (core.jsonrows): a fleet's shards repeat them.
    of = Shard.objects.filter(replica__in=[r["pk"] for r in rows]) if model else Shard.objects.all()
    for s in values_decoded_once(of.order_by(), _SHARD_LISTED, _SHARD_JSON):
        shards[s["replica_id"]].append(s)
    # What the agents reported is read only when some shard shows a download, and then as before, from
    # every node with a shard listed: the shard ids are looked up among all their reports.
    listed = [s for group in shards.values() for s in group]
    fetching = any(s["state"] in _FETCHING for s in listed)
    reported = _reported_fetches({s["node_id"] for s in listed}) if fetching else {}
    starts = _starts(rows)
    now_us = dbtimes.now_microseconds(now)
    views = [_replica_view(r, shards.get(r["pk"], []), reported, now_us) for r in rows]
    for view in views:
        if view["id"] in starts:
            view["start"] = starts[view["id"]]
    return views


def _reported_fetches(node_ids: set[int]) -> dict[str, dict]:
    """The downloads the agents last reported, by shard id: fresher than the rows when the reconciler lags."""
    out = {}
    for status in Node.objects.filter(pk__in=node_ids).values_list("shard_status", flat=True):
        for s in status or []:
            if isinstance(s, dict) and isinstance(s.get("id"), str) and isinstance(s.get("fetch"), dict):
                out[s["id"]] = s["fetch"]
    return out


def _replica_view(r: dict[str, Any], shards: list[dict], reported: dict[str, dict], now_us: int) -> dict[str, Any]:
    """One replica of the list from its values() row (``_LISTED``) and its shards' rows; ``now_us`` in microseconds."""
    # Replica.stale, from the row: a replica with no recorded fingerprint or no profile is not stale.
    stale = bool(r["profile_fingerprint"]) and r["profile_id"] is not None
    last_used = r["last_used_us"]
    view: dict[str, Any] = {
        "id": r["pk"],
        "model": r["model__name"],
        "profile": r["profile_name"],
        "stale": stale and r["profile__fingerprint"] != r["profile_fingerprint"],
        "state": r["state"],
        "age_seconds": dbtimes.whole_seconds_since(now_us, r["created_us"]),
        "idle_seconds": -1 if last_used is None else dbtimes.whole_seconds_since(now_us, last_used),
        "gpus": sum(len(s["gpu_indices"] or []) for s in shards),
        "shards": [_shard_view(r["pk"], s, reported) for s in sorted(shards, key=lambda s: s["rank"])],
    }
    domain = (
        NVLinkDomain.key_of(r["nvlink_domain__cluster_uuid"], r["nvlink_domain__clique_id"])
        if r["nvlink_domain_id"] is not None
        else ""
    )
    for key, value in (
        ("pool", r["pool"]),
        ("fabric", r["fabric"]),
        ("nvlink_domain", domain),
        ("endpoint", r["endpoint"]),
        ("error", r["error"]),
        ("replaces", r["replaces_id"] or ""),
    ):
        if value:
            view[key] = value
    return view


def _shard_view(replica_id: str, s: dict, reported: dict[str, dict]) -> dict[str, Any]:
    sid = f"{replica_id}-{s['rank']}"
    view: dict[str, Any] = {
        "id": sid,
        "node": s["node__name"],
        "rank": s["rank"],
        "gpus": held_indices(s["gpu_indices"]),
        "gpu_labels": [mig_label(i) for i in held_indices(s["gpu_indices"])],
        "state": s["state"],
    }
    if s["error"]:
        view["error"] = s["error"]
    fetch = fetch_view(s, reported.get(sid))
    if fetch is not None:
        view["fetch"] = fetch
    if s.get("phases"):
        view["phases"] = dict(s["phases"]) if isinstance(s["phases"], dict) else s["phases"]
    return view


def fetch_view(shard: dict, reported: dict | None) -> dict[str, Any] | None:
    """The download a shard waits on, None when it waits on none.

    ``percent`` is absent when the total is unknown: an invented percentage
    that stops moving is worse than a byte count that keeps rising.
    """
    if shard["state"] not in ("pending", "fetching"):
        return None
    source, done, total = shard["fetch_source"], shard["fetch_done"], shard["fetch_total"]
    if reported and isinstance(reported.get("bytes_done"), int):
        source = str(reported.get("source") or source)
        done = reported["bytes_done"]
        total = reported.get("bytes_total") if isinstance(reported.get("bytes_total"), int) else None
    if done is None:
        return None
    view: dict[str, Any] = {"source": source or "", "bytes_done": max(0, done)}
    if total:
        view["bytes_total"] = total
        view["percent"] = min(100, int(max(0, done) * 100 / total))
    return view


def explain(model: CatalogModel) -> dict[str, Any]:
    """The scheduler's latest word on a model: placed, or each candidate it turned down and why.

    ``rejections`` empty with ``computed_at`` absent means the reconciler has
    not looked at the model yet; ``note`` says so in words.
    """
    placed = Replica.objects.filter(model=model, state__in=COUNTING).exists()
    view: dict[str, Any] = {"model": model.name, "placed": placed, "rejections": []}
    explanation = PlacementExplanation.objects.filter(model=model).first()
    if explanation is None:
        view["note"] = "The reconciler has not looked at this model yet; ask again in a few seconds."
        return view
    _add_autoscale(view, model)
    view["computed_at"] = explanation.computed_at.isoformat()
    view["satisfied"] = explanation.placed
    view["rejections"] = [_rejection(r) for r in explanation.rejections or [] if isinstance(r, dict)]
    if explanation.start_timeouts:
        view["start_timeouts"] = list(explanation.start_timeouts)
    if explanation.placed and not view["rejections"]:
        view["note"] = "The model has as many replicas as it wants: nothing to explain."
    return view


def _rejection(r: dict) -> dict[str, Any]:
    view: dict[str, Any] = {"profile": str(r.get("profile") or ""), "reason": str(r.get("reason") or "")}
    for key in ("pool", "node"):
        if r.get(key):
            view[key] = str(r[key])
    if isinstance(r.get("nodes"), int):
        view["nodes"] = r["nodes"]
    return view


# --- models with their replicas -----------------------------------------------------------


def _replica_counts() -> dict[int, dict[str, int]]:
    """Model id → its replicas ``ready`` and in ``total`` (pending, starting and ready), as model_view reads them."""
    return {
        row["model_id"]: row
        for row in Replica.objects.order_by()
        .values("model_id")
        .annotate(total=Count("id", filter=Q(state__in=COUNTING)), ready=Count("id", filter=Q(state="ready")))
    }


def _unplaced() -> set[int]:
    """The models the scheduler last said it could not place."""
    return set(PlacementExplanation.objects.filter(placed=False).values_list("model_id", flat=True))


def model_list(name: str | None = None) -> list[dict[str, Any]]:
    """Every model (or the one called ``name``) with its scaling, profiles and replicas (ready and in all)."""
    counts, unplaced = _replica_counts(), _unplaced()
    scaling = {a.model_id: a for a in Autoscale.objects.all()}
    out = []
    for m in model_rows(name):
        view = model_view(m, counts.get(m.pk, {}), m.pk in unplaced)
        row = scaling.get(m.pk)
        view["desired_replicas"] = row.desired if row is not None else m.min_replicas
        if row is not None:
            view["autoscale"] = autoscale_view(row)
        out.append(view)
    return out


# What model_standing gives of each model: model_list's entries' keys that say how it stands.
STANDING = ("name", "min_replicas", "ready_replicas", "total_replicas", "parked", "unplaceable")
STANDING_PARKED = ("parked_error", "failures")


def model_standing() -> list[dict[str, Any]]:
    """Every model by name with only what says how it stands: :func:`model_list`'s ``STANDING`` keys, the same values.

    With ``parked_error`` and ``failures`` when parked, as there. For the
    summary's counts, which read nothing else: model_list also reads each
    model's aliases, adapters, profiles, fallbacks and prefetches and its
    autoscaler's row, six more queries that were a tenth of the summary's
    time at 10,000 nodes. A test holds the two equal on random catalogs.
    """
    counts, unplaced = _replica_counts(), _unplaced()
    out = []
    rows = CatalogModel.objects.order_by("name").values_list(
        "pk", "name", "min_replicas", "parked_at", "parked_error", "failure_streak"
    )
    for pk, name, low, parked_at, error, failures in rows:
        mine = counts.get(pk, {})
        view: dict[str, Any] = {
            "name": name,
            "min_replicas": low,
            "ready_replicas": mine.get("ready", 0),
            "total_replicas": mine.get("total", 0),
            "parked": parked_at is not None,
            "unplaceable": pk in unplaced,
        }
        if parked_at is not None:
            view.update(parked_error=error, failures=failures)
        out.append(view)
    return out


# --- autoscaling ------------------------------------------------------------------------


def desired_and_running() -> list[tuple[str, int, int]]:
    """Per model by name: replicas wanted (the autoscaler's count, else the minimum) and replicas ready; two queries.

    What ``/metrics`` exports and ``model_list`` shows as ``desired_replicas`` and ``ready_replicas``.
    """
    ready = dict(
        Replica.objects.filter(state=ReplicaState.READY)
        .order_by()
        .values("model_id")
        .annotate(n=Count("id"))
        .values_list("model_id", "n")
    )
    rows = CatalogModel.objects.order_by("name").values_list("pk", "name", "min_replicas", "autoscale__desired")
    return [(name, low if wanted is None else wanted, ready.get(pk, 0)) for pk, name, low, wanted in rows]


RECENT_SCALE_EVENTS = 10


def autoscale_view(row: Autoscale, events: list[ScaleEvent] | None = None) -> dict[str, Any]:
    """The autoscaler's latest word on a model: the count, why in numbers, and the load and capacity it read.

    ``events`` given: its latest changes, newest first, under ``history``.
    """
    view: dict[str, Any] = {
        "desired": row.desired,
        "direction": row.direction,
        "reason": row.reason,
        "decided_at": row.decided_at.isoformat(),
        "replicas": row.replicas,
        "load": {
            "in_flight": row.in_flight,
            "waiting": row.waiting,
            "tokens_per_second": row.tokens_per_s,
            "workers": row.workers,
            "source": row.load_source,
        },
        "capacity": {
            "profile": row.capacity_profile,
            "concurrency": row.capacity_concurrency,
            "measured": row.capacity_measured,
        },
    }
    if row.changed_at is not None:
        view["changed_at"] = row.changed_at.isoformat()
    if row.ttft_ms is not None:
        view["load"]["time_to_first_token_ms"] = row.ttft_ms
    if row.capacity_tokens_per_s is not None:
        view["capacity"]["tokens_per_second"] = row.capacity_tokens_per_s
    if events is not None:
        view["history"] = [
            {
                "at": e.at.isoformat(),
                "from": e.from_replicas,
                "to": e.to_replicas,
                "direction": e.direction,
                "reason": e.reason,
            }
            for e in events
        ]
    return view


def _add_autoscale(view: dict[str, Any], model: CatalogModel) -> None:
    row = Autoscale.objects.filter(model=model).first()
    if row is not None:
        events = list(ScaleEvent.objects.filter(model=model).order_by("-at", "-id")[:RECENT_SCALE_EVENTS])
        view["autoscale"] = autoscale_view(row, events)


# --- nodes with what is placed on them ----------------------------------------------------


def node_usage(node_id: int | None = None) -> NodeUsage:
    """Which GPUs every node's shards (or one node's) hold, and how many replicas run there."""
    # Every shard holds its GPUs, failed and stopping ones too: their
    # processes may keep the memory until the agent has stopped them.
    shards = Shard.objects.all() if node_id is None else Shard.objects.filter(node_id=node_id)
    # Each distinct list of indices decoded once (core.jsonrows): a fleet's shards hold a few dozen
    # different lists, and decoding 7,900 of them was a sixth of the fleet page at 10,000 nodes.
    decode = DecodedOnce()
    rows = values_list_as_text(shards.order_by(), USAGE_FIELDS, ("gpu_indices",))  # sets: no order needed
    return NodeUsage((node, decode(indices), replica) for node, indices, replica in rows)


USAGE_FIELDS = ("node_id", "gpu_indices", "replica_id")


def node_list(
    now: datetime | None = None, fields: frozenset[str] | None = None, wiring: bool = False
) -> list[dict[str, Any]]:
    """Every node as ``ctl nodes`` and the console's node table show it (``inventory.reads.nodes.node_list``).

    ``wiring`` adds each node's ``gpus`` and ``ib_ports``, as the API lists
    them; ``fields`` keeps only those top-level keys (``?fields=`` in the API).
    """
    return inventory_nodes.node_list(node_usage(), now, fields, wiring)


def node_tiles() -> list[dict[str, Any]]:
    """Every node as the console's strip of tiles shows it (``inventory.reads.tiles.node_tiles``)."""
    return inventory_tiles.node_tiles(node_usage())


def node_pages(
    now: datetime | None = None,
    fields: frozenset[str] | None = None,
    wiring: bool = False,
    size: int | None = None,
    after: str | None = None,
) -> Iterator[list[dict[str, Any]]]:
    """:func:`node_list` in pages of ``size`` nodes, each read when asked for (``inventory.reads.nodes.node_pages``)."""
    return inventory_nodes.node_pages(node_usage(), now, fields, wiring, size, after)


def node_pages_json(
    dumps: Callable[[Any], str],
    now: datetime | None = None,
    fields: frozenset[str] | None = None,
    size: int | None = None,
) -> Iterator[list[str]]:
    """:func:`node_pages` with the wiring, each node as its JSON text (``inventory.reads.node_listing``)."""
    return node_listing.node_pages_json(node_usage(), dumps, now, fields, size)


def node_detail(name: str, now: datetime | None = None) -> dict[str, Any] | None:
    """One node with its cards, ports and the shards placed on it; None if unknown."""
    node = Node.objects.filter(name=name).first()
    if node is None:
        return None
    return inventory_nodes.node_detail(node, node_usage(node.pk), node_gpu_holders(node.pk), node_shards(node), now)


def node_gpu_holders(node_id: int) -> dict[int, str]:
    """GPU index → the replica whose shard holds it on this node, as ``model#replica``."""
    holders = {}
    for replica_id, model, indices in Shard.objects.filter(node_id=node_id).values_list(
        "replica_id", "replica__model__name", "gpu_indices"
    ):
        for i in indices or []:
            holders[i] = f"{model}#{replica_id}"
    return holders


def node_shards(node: Node) -> list[dict[str, Any]]:
    """The shards placed on a node, with what its agent last said of each (state, error, download)."""
    reported = {s.get("id"): s for s in node.shard_status or [] if isinstance(s, dict)}
    out = []
    for s in Shard.objects.filter(node=node).select_related("replica__model").order_by("replica_id", "rank"):
        sid = f"{s.replica_id}-{s.rank}"
        view: dict[str, Any] = {
            "id": sid,
            "replica": s.replica_id,
            "model": s.replica.model.name,
            "rank": s.rank,
            "gpus": [mig_label(i) for i in held_indices(s.gpu_indices)],
            "state": s.state,
        }
        agent = reported.get(sid) or {}
        if isinstance(agent.get("state"), str):
            view["reported_state"] = agent["state"]
        error = s.error or (agent.get("error") if isinstance(agent.get("error"), str) else None)
        if error:
            view["error"] = error
        out.append(view)
    return out
