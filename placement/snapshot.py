"""Inventory and catalog rows turned into the pure scheduler's dataclasses.

Everything the scheduler decides from is read here, in a handful of queries,
so the reconciler's plan is made from one consistent picture. Unknown stays
unknown on the way: a NULL column becomes None, never an empty value.

Lost nodes (``Node.lost``) are left out altogether: what was placed on them
counts as gone. Nodes that are merely unreachable stay in, marked so, which
keeps their replicas (and the GPUs those hold) while nothing new lands there.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from catalog.models import CatalogModel, Profile
from catalog.reads import source_refers_to
from core.jsonrows import PerValue, values_decoded_once
from inventory import fabric_inventory, failure_rules
from inventory.devices import held_indices
from inventory.fabrics import FabricReport
from inventory.loss_settings import loss_rules
from inventory.models import GPU, CardHold, Node, NVLinkDomain
from inventory.reads import flaps
from placement.models import Demand, Replica, Shard
from placement.scheduler import GpuInfo, ModelInfo, NodeInfo, ReplicaInfo, ShardInfo, Snapshot

# Demand nobody could satisfy is forgotten after this long.
DEMAND_TTL = timedelta(minutes=5)


@dataclass
class Loaded:
    """The snapshot, and what the reconciler needs to turn the plan's names back into rows."""

    snapshot: Snapshot
    node_ids: dict[str, int] = field(default_factory=dict)
    domain_ids: dict[str, int] = field(default_factory=dict)
    model_ids: dict[str, int] = field(default_factory=dict)
    profile_ids: dict[tuple[str, str], int] = field(default_factory=dict)


def load(
    now: datetime, scale: Mapping[str, tuple[int, str]] | None = None, fabrics: FabricReport | None = None
) -> Loaded:
    """Read the fleet, the catalog and the replicas as they are now.

    ``scale`` is the autoscaler's count and reason per model
    (``placement.writes.autoscaling``); a model missing from it is not autoscaled.
    ``fabrics`` is the fabric analysis when the caller has made it already (the
    what-if reads fabric names from it too); it is made here otherwise.
    """
    nodes, node_ids = _nodes(fabrics, now)
    models, model_ids, profile_ids = _models(now, scale or {})
    replicas = _replicas(set(node_ids))
    domain_ids = {d.key: d.pk for d in NVLinkDomain.objects.all()}
    snapshot = Snapshot(
        nodes=tuple(nodes), models=tuple(models), replicas=tuple(replicas), now=now, weights=weights_held(set(node_ids))
    )
    return Loaded(snapshot, node_ids, domain_ids, model_ids, profile_ids)


# --- nodes ------------------------------------------------------------------------


# The columns node_info and gpu_info read, and no others: a fleet's rows carry
# far more (discovery's JSON above all) than the scheduler decides from, and
# building whole model instances of every node and card was most of a reconcile.
NODE_COLUMNS = ("pk", "name", "state", "reachable", "labels", "engines", "memory_mb", "imex_state", "imex_channels")
NODE_JSON = ("labels", "engines", "imex_channels")
GPU_COLUMNS = (
    "node_id",
    "index",
    "gpu_class",
    "uuid",
    "health",
    "numa",
    "nvlink_peers",
    "parent_index",
    "mig_uuid",
    "mig_mode",
    "fabric_state",
    "fabric_status",
    "fabric_degraded",
    "domain_id",
    "domain__cluster_uuid",
    "domain__clique_id",
)
GPU_JSON = ("health", "nvlink_peers")


def _nodes(report: FabricReport | None, now: datetime) -> tuple[list[NodeInfo], dict[str, int]]:
    # Each distinct JSON value is decoded once (core.jsonrows): every card of a kind has the same peers.
    rows = list(values_decoded_once(Node.objects.filter(lost=False).order_by("name"), NODE_COLUMNS, NODE_JSON))
    gpus_by_node: dict[int, list[GpuInfo]] = defaultdict(list)
    cards = GPU.objects.filter(node__lost=False).order_by("node_id", "index")
    peers_of, problems_of = PerValue(card_peers), PerValue(card_problems)
    for g in values_decoded_once(cards, GPU_COLUMNS, GPU_JSON):
        gpus_by_node[g["node_id"]].append(gpu_info(g, peers_of=peers_of, problems_of=problems_of))
    fabrics = node_fabrics(report)
    holds = {
        (node_pk, index): reason
        for node_pk, index, reason in CardHold.objects.filter(node__lost=False).values_list(
            "node_id", "gpu_index", "reason"
        )
    }
    if holds:
        for node_pk, gpus in gpus_by_node.items():
            gpus[:] = [replace(g, held=holds.get((node_pk, g.index))) for g in gpus]
    flapping = _flapping(now)
    out = []
    for n in rows:
        info = node_info(n, tuple(gpus_by_node.get(n["pk"], ())), fabrics.get(n["name"]))
        if n["name"] in flapping:
            info = replace(info, flapping=flapping[n["name"]])
        out.append(info)
    return out, {n["name"]: n["pk"] for n in rows}


def _flapping(now: datetime) -> dict[str, str]:
    """Node name → why it takes nothing new, for nodes that came back within the flap window.

    Off with the cordon rule (``LLMGW_FLAPS_TO_CORDON`` 0): the one is the
    other's first step.
    """
    rules = loss_rules()
    if rules.flaps_to_cordon <= 0:
        return {}
    return {
        name: reason
        for name, f in flaps.flapping(now, rules.flap_window_s).items()
        if (reason := failure_rules.flapping_reason(f.returns, rules.flap_window_s))
    }


def node_info(n: Mapping[str, Any], gpus: tuple[GpuInfo, ...], fabric: str | None) -> NodeInfo:
    """One node as the scheduler sees it, from its ``NODE_COLUMNS`` as ``values()`` gives them.

    ``fabric`` is its physical InfiniBand fabric, None when not known.
    """
    channels = n["imex_channels"]
    engines = n["engines"]
    return NodeInfo(
        name=n["name"],
        state=n["state"],
        reachable=n["reachable"],
        labels={str(k): str(v) for k, v in (n["labels"] or {}).items()},
        engines=None if engines is None else frozenset(engines),
        memory_mb=n["memory_mb"],
        imex_state=n["imex_state"] or None,
        imex_channels=len(channels) if isinstance(channels, list) else None,
        fabric=fabric,
        gpus=gpus,
    )


def card_peers(peers: Any) -> frozenset[int] | None:
    """A card's stored NVLink peers as the scheduler reads them: the card indices; None when not reported."""
    return None if peers is None else frozenset(int(p) for p in peers if isinstance(p, int))


def card_problems(health: Any) -> tuple[str, ...]:
    """A card's stored health problems, in words; empty when it has none."""
    return tuple(str(p) for p in (health or []))


def gpu_info(
    g: Mapping[str, Any],
    *,
    peers_of: Callable[[Any], frozenset[int] | None] = card_peers,
    problems_of: Callable[[Any], tuple[str, ...]] = card_problems,
) -> GpuInfo:
    """One card or MIG instance as the scheduler sees it, from its ``GPU_COLUMNS`` as ``values()`` gives them.

    ``peers_of`` and ``problems_of`` read its two JSON columns; ``_nodes``
    passes them memoized (core.jsonrows.PerValue), since every card of a kind
    has the same peers and every healthy card the same empty problems.
    """
    health = g["health"]
    parent = g["parent_index"]
    domain = g["domain_id"]
    return GpuInfo(
        index=g["index"],
        gpu_class=g["gpu_class"],
        uuid=g["uuid"],
        healthy=not health,
        problems=problems_of(health),
        numa=g["numa"],
        nvlink_peers=peers_of(g["nvlink_peers"]),
        parent=parent,
        mig_uuid=g["mig_uuid"],
        mig_mode=parent is None and g["mig_mode"].startswith("enabled"),
        fabric_state=g["fabric_state"],
        fabric_status=g["fabric_status"],
        domain=None if domain is None else NVLinkDomain.key_of(g["domain__cluster_uuid"], g["domain__clique_id"]),
        degraded=g["fabric_degraded"],
    )


def node_fabrics(report: FabricReport | None = None) -> dict[str, str]:
    """Node name → the one physical fabric (SM, or RoCE network) all its live ports are on.

    A node missing here has no port, or ports on two fabrics, or one whose
    subnet manager could not be read: it takes no multi-node replica over
    InfiniBand, since its peers might be reached through the wrong fabric.
    The same analysis the fabrics page and the sweeps read (inventory.fabric_inventory):
    the ``report`` when the caller made one, else only its answer for each node.
    """
    if report is None:
        return fabric_inventory.node_fabrics()
    out = {}
    for name in report.node_fabrics:
        key = report.fabric_of(name)
        if key is not None:
            out[name] = key
    return out


def weights_held(live_nodes: set[str]) -> dict[str, frozenset[str]]:
    """Model name → the live nodes whose agents reported a complete copy of its weights on disk.

    A copy the scan marked incomplete (a download cut short, a broken link) is
    not counted: landing there would fetch anyway. The catalog's own rule for
    "this source names these weights" (``catalog.reads.source_refers_to``) decides.
    """
    sources = list(CatalogModel.objects.exclude(source="").values_list("name", "source"))
    if not sources:
        return {}
    out: dict[str, set[str]] = {}
    for node, weights in Node.objects.filter(lost=False).exclude(weights__isnull=True).values_list("name", "weights"):
        if node not in live_nodes:
            continue
        for w in weights or []:
            if not isinstance(w, dict) or w.get("incomplete"):
                continue
            for name, source in sources:
                if source_refers_to(source, w):
                    out.setdefault(name, set()).add(node)
    return {name: frozenset(nodes) for name, nodes in sorted(out.items())}


# --- catalog ----------------------------------------------------------------------


def _models(
    now: datetime, scale: Mapping[str, tuple[int, str]]
) -> tuple[list[ModelInfo], dict[str, int], dict[tuple[str, str], int]]:
    rows = list(CatalogModel.objects.prefetch_related("profiles").order_by("name"))
    waiting = set(Demand.objects.filter(requested_at__gte=now - DEMAND_TTL).values_list("model__name", flat=True))
    models, model_ids, profile_ids = [], {}, {}
    for m in rows:
        profiles = sorted(m.profiles.all(), key=lambda p: (p.position, p.name))
        for p in profiles:
            profile_ids[(m.name, p.name)] = p.pk
        model_ids[m.name] = m.pk
        models.append(model_info(m, profiles, wanted=1 if m.name in waiting else None, scale=scale.get(m.name)))
    return models, model_ids, profile_ids


def model_info(
    m: CatalogModel, profiles: list[Profile], wanted: int | None = None, scale: tuple[int, str] | None = None
) -> ModelInfo:
    """``wanted`` is 1 when a request is waiting for a model that has no replica; None otherwise.

    ``scale`` is the autoscaler's count and its reason; None when the model is not autoscaled.

    Each profile reaches the scheduler as the catalog's own spec (``Profile.spec()``), stored fingerprint and all.
    """
    return ModelInfo(
        name=m.name,
        profiles=tuple(p.spec() for p in profiles),
        min_replicas=m.min_replicas,
        max_replicas=m.max_replicas,
        wanted=wanted,
        idle_timeout_s=m.idle_timeout.total_seconds() if m.idle_timeout is not None else None,
        parked_error=(m.parked_error or "no error was recorded") if m.parked_at else None,
        scale_to=scale[0] if scale is not None else None,
        scale_reason=scale[1] if scale is not None else "",
    )


# --- replicas ---------------------------------------------------------------------


REPLICA_COLUMNS = (
    "id",
    "model__name",
    "profile_name",
    "state",
    "created_at",
    "profile_fingerprint",
    "last_used_at",
    "replaces_id",
    "ready_at",
)


def _replicas(live_nodes: set[str]) -> list[ReplicaInfo]:
    """Every replica, each with the shards on nodes that are not lost.

    A replica with a shard on a lost node is marked stopping by the reconciler
    before the snapshot is taken, so here it holds only what it still holds.
    Two queries of plain rows, shards by replica and rank: a fleet serving a
    few thousand replicas spent seconds of each round building them as model
    instances through prefetch_related.
    """
    shards: dict[str, list[ShardInfo]] = defaultdict(list)
    rows = Shard.objects.order_by("replica_id", "rank").values_list("replica_id", "node__name", "rank", "gpu_indices")
    for replica_id, node, rank, gpus in rows:
        if node in live_nodes:
            shards[replica_id].append(ShardInfo(node=node, rank=rank, gpus=tuple(held_indices(gpus))))
    return [
        ReplicaInfo(
            id=rid,
            model=model,
            profile=profile,
            state=state,
            shards=tuple(shards.get(rid, ())),
            created_at=created_at,
            fingerprint=fingerprint,
            last_used_at=last_used_at,
            replaces=replaces,
            ready_at=ready_at,
        )
        for rid, model, profile, state, created_at, fingerprint, last_used_at, replaces, ready_at in (
            Replica.objects.order_by("id").values_list(*REPLICA_COLUMNS)
        )
    ]
