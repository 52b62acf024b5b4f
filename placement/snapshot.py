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
from collections.abc import Callable, Hashable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, Generic, TypeVar

from catalog.models import CatalogModel, Profile
from catalog.reads import source_refers_to
from core.fingerprints import group_fingerprint, group_fingerprints, row_fingerprint
from core.jsonrows import DecodedOnce, PerValue, values_decoded_once, values_list_as_text
from inventory import fabric_inventory, failure_rules
from inventory.devices import held_indices, mig_enabled
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
    A reader of its own, which reads everything: see :class:`FleetReader` for one kept from round to round.
    """
    return FleetReader().load(now, scale, fabrics)


K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

# Rows re-read by key are asked for in batches of this many keys; a reader with nothing kept reads whole
# tables instead.
BATCH = 500


class Kept(Generic[K, V]):
    """What was built from each key's rows, beside the fingerprint of the rows it was built from."""

    def __init__(self) -> None:
        self._by_key: dict[K, tuple[str | None, V]] = {}

    def __bool__(self) -> bool:
        return bool(self._by_key)

    def stale(self, fingerprints: Mapping[K, str | None]) -> list[K]:
        """The keys whose rows must be read again; keys no longer among ``fingerprints`` are forgotten."""
        kept = self._by_key
        for gone in kept.keys() - fingerprints.keys():
            del kept[gone]
        return [k for k, fp in fingerprints.items() if (seen := kept.get(k)) is None or seen[0] != fp]

    def keep(self, key: K, fingerprint: str | None, value: V) -> None:
        self._by_key[key] = (fingerprint, value)

    def get(self, key: K, default: V) -> V:
        seen = self._by_key.get(key)
        return default if seen is None else seen[1]


def batches(keys: list[K]) -> Iterator[list[K]]:
    for start in range(0, len(keys), BATCH):
        yield keys[start : start + BATCH]


class FleetReader:
    """Reads the snapshot round after round, building again only what was built from rows that changed.

    The reconciler keeps one beside its planner. Each round it asks the
    database for the fingerprints of the rows the scheduler decides from
    (``core.fingerprints``: a node's columns, its cards', each replica's and its
    shards'), and reads and builds only where one differs from the fingerprint
    of what it holds. A node or replica whose rows are as they were comes back
    as the very object it was last round, which is also what lets the planner
    skip it (``placement.scheduler.Planner``). Holds, fabrics, flapping, the
    catalog and NVLink domains are few rows, or worked out elsewhere: they are
    read every round.

    Its snapshot is always the one a new reader would read
    (tests/placement/test_snapshot_kept.py); a reader with nothing kept, the
    first round's or :func:`load`'s, reads whole tables and no fingerprint
    twice. Not for two threads at once.
    """

    def __init__(self) -> None:
        self._rows: Kept[int, dict[str, Any]] = Kept()
        self._cards: Kept[int, tuple[GpuInfo, ...]] = Kept()
        self._infos: dict[int, tuple[tuple, NodeInfo]] = {}
        self._replicas: Kept[str, tuple] = Kept()
        self._shards: Kept[str, tuple[ShardInfo, ...]] = Kept()
        self._replica_infos: dict[str, tuple[tuple, ReplicaInfo]] = {}

    def load(
        self, now: datetime, scale: Mapping[str, tuple[int, str]] | None = None, fabrics: FabricReport | None = None
    ) -> Loaded:
        """As :func:`load`."""
        nodes, node_ids = self._nodes(fabrics, now)
        models, model_ids, profile_ids = _models(now, scale or {})
        replicas = self._replicas_now()
        domain_ids = {d.key: d.pk for d in NVLinkDomain.objects.all()}
        snapshot = Snapshot(
            nodes=tuple(nodes),
            models=tuple(models),
            replicas=tuple(replicas),
            now=now,
            weights=weights_held(set(node_ids)),
        )
        return Loaded(snapshot, node_ids, domain_ids, model_ids, profile_ids)

    # --- nodes ---

    def _nodes(self, report: FabricReport | None, now: datetime) -> tuple[list[NodeInfo], dict[str, int]]:
        live = Node.objects.filter(lost=False)
        cards = GPU.objects.filter(node__lost=False).order_by()
        if not self._rows:
            self._rows, self._cards = Kept(), Kept()
            order = [(r["pk"], r["name"], fp) for r, fp in self._read_rows(live)]
            self._read_cards(cards, [pk for pk, _, _ in order])
        else:
            order = list(live.annotate(fp=NODE_FINGERPRINT).order_by("name").values_list("pk", "name", "fp"))
            for pks in batches(self._rows.stale({pk: fp for pk, _, fp in order})):
                self._read_rows(live.filter(pk__in=pks))
            held = group_fingerprints(cards, "node_id", *CARDS_FOLLOWED)
            for pks in batches(self._cards.stale({pk: held.get(pk) for pk, _, _ in order})):
                self._read_cards(cards.filter(node_id__in=pks), pks)
        fabrics = node_fabrics(report)
        holds: dict[int, dict[int, str]] = defaultdict(dict)
        for node_pk, index, reason in CardHold.objects.filter(node__lost=False).values_list(
            "node_id", "gpu_index", "reason"
        ):
            holds[node_pk][index] = reason
        flapping = _flapping(now)
        infos: dict[int, tuple[tuple, NodeInfo]] = {}
        out = []
        for pk, name, _ in order:
            row = self._rows.get(pk, {})
            if not row:
                continue  # gone between the fingerprints and the reading: next round's
            cards = self._cards.get(pk, ())
            node_holds = holds.get(pk)
            key = (row, cards, fabrics.get(name), flapping.get(name), node_holds)
            seen = self._infos.get(pk)
            if seen is not None and all(a is b or a == b for a, b in zip(seen[0], key, strict=True)):
                info = seen[1]
            else:
                info = _node_info_held(row, cards, fabrics.get(name), flapping.get(name), node_holds)
            infos[pk] = (key, info)
            out.append(info)
        self._infos = infos
        return out, {info.name: pk for pk, (_, info) in infos.items()}

    def _read_rows(self, nodes) -> list[tuple[dict[str, Any], str]]:
        """Nodes' rows, kept with their fingerprints, in name order."""
        read = []
        query = nodes.annotate(fp=NODE_FINGERPRINT).order_by("name")
        for row in values_decoded_once(query, (*NODE_COLUMNS, "fp"), NODE_JSON):
            fp = row.pop("fp")
            self._rows.keep(row["pk"], fp, row)
            read.append((row, fp))
        return read

    def _read_cards(self, cards, pks: list[int]) -> None:
        """The cards of the nodes ``pks``, each node's kept with its cards' fingerprint (None for no card)."""
        by_node: dict[int, tuple[str, list[GpuInfo]]] = {}
        peers_of, problems_of = PerValue(card_peers), PerValue(card_problems)
        # A fleet's cards repeat their class and fabric state: one text each, not one per card. Per
        # reading, so that what nodes report cannot grow it past what one reading holds anyway.
        texts: dict[str, str] = {}
        query = cards.annotate(fp=CARDS_FINGERPRINT).order_by("node_id", "index")
        for g in values_decoded_once(query, (*GPU_COLUMNS, "fp"), GPU_JSON):
            node = by_node.setdefault(g["node_id"], (g["fp"], []))
            for name in ("gpu_class", "fabric_state", "fabric_status"):
                g[name] = texts.setdefault(g[name], g[name])
            node[1].append(gpu_info(g, peers_of=peers_of, problems_of=problems_of))
        for pk in pks:
            fp, infos = by_node.get(pk, (None, []))
            self._cards.keep(pk, fp, tuple(infos))

    # --- replicas ---

    def _replicas_now(self) -> list[ReplicaInfo]:
        """Every replica, each with its shards on nodes that are not lost (see :func:`_replica_info`)."""
        replicas = Replica.objects.all()
        shards = Shard.objects.filter(node__lost=False).order_by()
        if not self._replicas:
            self._replicas, self._shards = Kept(), Kept()
            order = [(row[0], fp) for row, fp in self._read_replicas(replicas)]
            self._read_shards(shards, [rid for rid, _ in order])
        else:
            order = list(replicas.annotate(fp=REPLICA_FINGERPRINT).order_by("id").values_list("id", "fp"))
            for ids in batches(self._replicas.stale(dict(order))):
                self._read_replicas(replicas.filter(id__in=ids))
            held = group_fingerprints(shards, "replica_id", *SHARDS_FOLLOWED)
            for ids in batches(self._shards.stale({rid: held.get(rid) for rid, _ in order})):
                self._read_shards(shards.filter(replica_id__in=ids), ids)
        infos: dict[str, tuple[tuple, ReplicaInfo]] = {}
        out = []
        for rid, _ in order:
            row = self._replicas.get(rid, ())
            if not row:
                continue
            key = (row, self._shards.get(rid, ()))
            seen = self._replica_infos.get(rid)
            info = seen[1] if seen is not None and seen[0] == key else _replica_info(row, key[1])
            infos[rid] = (key, info)
            out.append(info)
        self._replica_infos = infos
        return out

    def _read_replicas(self, replicas) -> list[tuple[tuple, str]]:
        read = []
        for *row, fp in replicas.annotate(fp=REPLICA_FINGERPRINT).order_by("id").values_list(*REPLICA_COLUMNS, "fp"):
            kept = tuple(row)
            self._replicas.keep(kept[0], fp, kept)
            read.append((kept, fp))
        return read

    def _read_shards(self, shards, ids: list[str]) -> None:
        """The shards of the replicas ``ids`` on nodes not lost, each replica's kept with their fingerprint."""
        by_replica: dict[str, tuple[str, list[ShardInfo]]] = {}
        indices = PerValue(lambda gpus: tuple(held_indices(gpus)))
        decode = DecodedOnce()
        query = shards.annotate(fp=SHARDS_FINGERPRINT).order_by("replica_id", "rank")
        for replica_id, node, rank, gpus, fp in values_list_as_text(query, SHARD_COLUMNS, ("gpu_indices",)):
            entry = by_replica.setdefault(replica_id, (fp, []))
            entry[1].append(ShardInfo(node=node, rank=rank, gpus=indices(decode(gpus))))
        for rid in ids:
            fp, infos = by_replica.get(rid, (None, []))
            self._shards.keep(rid, fp, tuple(infos))


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


# What a node's and its cards' fingerprints follow: exactly the columns read above (core.fingerprints).
NODE_FINGERPRINT = row_fingerprint(*(c for c in NODE_COLUMNS if c != "pk"))
CARDS_FOLLOWED = ("index", *(c for c in GPU_COLUMNS if c != "node_id"))
CARDS_FINGERPRINT = group_fingerprint("node_id", *CARDS_FOLLOWED)


def _node_info_held(
    row: Mapping[str, Any],
    cards: tuple[GpuInfo, ...],
    fabric: str | None,
    flapping: str | None,
    holds: Mapping[int, str] | None,
) -> NodeInfo:
    """A node as the scheduler sees it: its row, its cards with their holds, its fabric, why it is flapping."""
    if holds:
        cards = tuple(replace(g, held=holds.get(g.index)) for g in cards)
    info = node_info(row, cards, fabric)
    return info if flapping is None else replace(info, flapping=flapping)


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
    """A card's stored health problems, in words; empty when it has none.

    Unhealthy is a health Python reads as true, as the counts read it (inventory.devices): ingestion stores a
    list of problems, and anything else true that a row holds is one problem, never a crash of the snapshot.
    """
    if not health:
        return ()
    return tuple(str(p) for p in (health if isinstance(health, list) else [health]))


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
        mig_mode=parent is None and mig_enabled(g["mig_mode"]),
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


# A shard's node is read by name; its GPUs as JSON text, decoded once per distinct text.
SHARD_COLUMNS = ("replica_id", "node__name", "rank", "gpu_indices", "fp")
REPLICA_FINGERPRINT = row_fingerprint(*(c for c in REPLICA_COLUMNS if c != "id"))
SHARDS_FOLLOWED = ("rank", "node__name", "rank", "gpu_indices")
SHARDS_FINGERPRINT = group_fingerprint("replica_id", *SHARDS_FOLLOWED)


def _replica_info(row: tuple, shards: tuple[ShardInfo, ...]) -> ReplicaInfo:
    """A replica as the scheduler sees it, from its ``REPLICA_COLUMNS`` and its shards on nodes not lost.

    A replica with a shard on a lost node is marked stopping by the reconciler
    before the snapshot is taken, so it holds only what it still holds. Its
    shards are plain rows, read in one query with the others': a fleet serving
    a few thousand replicas spent seconds of each round building them as model
    instances through prefetch_related.
    """
    rid, model, profile, state, created_at, fingerprint, last_used_at, replaces, ready_at = row
    return ReplicaInfo(
        id=rid,
        model=model,
        profile=profile,
        state=state,
        shards=shards,
        created_at=created_at,
        fingerprint=fingerprint,
        last_used_at=last_used_at,
        replaces=replaces,
        ready_at=ready_at,
    )
