"""Placing one replica of one profile, taking what it uses out of the room.

Each function returns the replica, or None when the profile does not fit
anywhere right now; why is the business of ``explain``, which is only asked
when every profile of a model has failed (most attempts succeed, and the
reasons cost a look at many more nodes than a placement does).
"""

from __future__ import annotations

import itertools

from catalog.definitions import ProfileSpec
from catalog.rules import CPU_CLASS
from placement.scheduling.gpus import Quality, pick, shard_env
from placement.scheduling.room import Buckets, MemoryHeap, NodeRoom, Room
from placement.scheduling.types import GpuInfo, NewReplica, NewShard
from placement.scheduling.warmth import FABRIC, LOCAL

# How many nodes a single-node placement looks at past the first that fits,
# hoping for better NVLink/NUMA locality, before it settles for the best seen.
# Bounded so that a fragmented fleet does not turn each placement into a scan.
LOOK_FURTHER = 32


def place(room: Room, model: str, profile: ProfileSpec) -> NewReplica | None:
    """One replica of ``model`` with ``profile``, or None when it fits nowhere now."""
    if profile.gpu_class == CPU_CLASS:
        return _place_cpu(room, model, profile)
    if profile.nodes <= 1:
        return _place_one(room, model, profile)
    return _place_in_domain(room, model, profile) or _place_over_fabric(room, model, profile)


def _replica(model: str, profile: ProfileSpec, shards: list[NewShard], **where: str | None) -> NewReplica:
    return NewReplica(
        model=model,
        profile=profile.name,
        fingerprint=profile.fingerprint,
        shards=tuple(shards),
        pool=profile.pool or None,
        **where,  # type: ignore[arg-type]
    )


def _place_cpu(room: Room, model: str, profile: ProfileSpec) -> NewReplica | None:
    need = memory_mb(profile)
    pool = profile.pool or None

    def accept(name: str) -> bool:
        node = room.nodes[name]
        return (pool is None or node.pool == pool) and node.has_engine(profile.engine)

    for heap in (room.memory_cpu_only, room.memory_gpu_nodes):
        name = heap.take_first(need, accept)
        if name is not None:
            node = _warmest_memory_twin(room, model, heap, room.nodes[name], accept)
            room.take_memory(node, need)
            return _replica(model, profile, [NewShard(node=node.name, rank=0, gpus=(), env=shard_env(profile, ()))])
    return None


def _warmest_memory_twin(room: Room, model: str, heap: MemoryHeap, node: NodeRoom, accept) -> NodeRoom:
    """A holder of the weights exactly as roomy as ``node`` (and alike in pool and engines), else ``node``.

    ``node`` was taken off ``heap``; a twin chosen instead is taken off in its place.
    """
    holders = room.warmth.holders(model)
    if not holders or node.name in holders:
        return node
    for name in sorted(holders):
        twin = room.nodes.get(name)
        if (
            twin is None
            or twin.blocked
            or twin.has_gpus != node.has_gpus
            or twin.memory_free_mb != node.memory_free_mb
            or twin.pool != node.pool
            or twin.info.engines != node.info.engines
            or not accept(name)
        ):
            continue
        if heap.remove(name, twin.memory_free_mb or 0):
            heap.add(node.name, node.memory_free_mb or 0)
            return twin
    return node


def memory_mb(profile: ProfileSpec) -> int:
    return int((profile.memory_gb or 0) * 1024)


def _place_one(room: Room, model: str, profile: ProfileSpec) -> NewReplica | None:
    """The tightest node that fits, preferring one where the GPUs are as local as that node allows."""
    cls, need = profile.gpu_class, max(profile.gpus, 1)
    buckets = room.buckets_for(cls, profile.pool or None)
    if buckets is None:
        return None
    best: tuple[Quality, NodeRoom, tuple[GpuInfo, ...]] | None = None
    looked = 0
    for name in buckets.at_least(need):
        node = room.nodes[name]
        if not node.has_engine(profile.engine):
            continue
        chosen, q = pick(node.free_gpus(cls), need)
        if q <= ideal(node, cls, need):
            best = (q, node, chosen)
            break
        if best is None or q < best[0]:
            best = (q, node, chosen)
        looked += 1
        if looked >= LOOK_FURTHER:
            break
    if best is None:
        return None
    q, node, chosen = best
    node, chosen = _warmest_equal(room, model, profile, buckets, node, q, chosen)
    room.take_gpus(node, cls, tuple(g.index for g in chosen))
    shard = NewShard(node=node.name, rank=0, gpus=tuple(g.index for g in chosen), env=shard_env(profile, chosen))
    return _replica(model, profile, [shard])


def _warmest_equal(
    room: Room, model: str, profile: ProfileSpec, buckets: Buckets, node: NodeRoom, q: Quality, chosen: tuple
) -> tuple[NodeRoom, tuple[GpuInfo, ...]]:
    """The warmest node exactly as good as ``node``: interchangeable with it, its GPUs as local (``q``).

    Holders of the weights are looked up directly (there are few); nodes on a
    holder's fabric are looked for in the same bucket, no further than a
    placement looks. ``node`` itself when no equal candidate is warmer.
    """
    warmth = room.warmth
    holders = warmth.holders(model)
    if not holders or warmth.rank(model, node.name) == LOCAL:
        return node, chosen
    cls, need = profile.gpu_class, max(profile.gpus, 1)
    bucket = buckets.by_free.get(node.free[cls], {})

    def equal(name: str) -> tuple[GpuInfo, ...] | None:
        other = room.nodes[name]
        if not interchangeable(node, other):
            return None
        picked, quality = pick(other.free_gpus(cls), need)
        return picked if quality == q else None

    for name in sorted(holders):
        if name in bucket and (picked := equal(name)) is not None:
            return room.nodes[name], picked
    if warmth.rank(model, node.name) == FABRIC:
        return node, chosen
    for looked, name in enumerate(bucket):
        if looked >= LOOK_FURTHER:
            break
        if warmth.rank(model, name) == FABRIC and (picked := equal(name)) is not None:
            return room.nodes[name], picked
    return node, chosen


def ideal(node: NodeRoom, cls: str, need: int) -> Quality:
    """The best locality this node could give ``need`` GPUs of ``cls`` if it were empty."""
    key = (cls, need)
    if key not in node.ideal:
        node.ideal[key] = pick(node.stock[cls].placeable, need)[1]
    return node.ideal[key]


def domain_ready(node: NodeRoom, profile: ProfileSpec) -> bool:
    """Whether a node of a domain can take a shard now (the domain itself was checked by the caller)."""
    return (
        node.imex_problem is None
        and (not profile.pool or node.pool == profile.pool)
        and node.has_engine(profile.engine)
        and node.free[profile.gpu_class] >= profile.gpus
    )


def _place_in_domain(room: Room, model: str, profile: ProfileSpec) -> NewReplica | None:
    """Inside one multi-node NVLink domain: the domain with the fewest able nodes that still has enough."""
    cls = profile.gpu_class
    shape = (profile.pool, profile.engine, profile.gpus)
    # No domain had this many able nodes when the class was last as it is now: none has yet.
    failed = room.no_domain.get((cls, *shape))
    if failed is not None and failed[0] == room.version.get(cls, 0) and failed[1] <= profile.nodes:
        return None
    best: tuple[int, str, list[NodeRoom]] | None = None
    for domain in room.domains.get(cls, {}):
        able = room.domain_able(cls, domain, shape, lambda n: domain_ready(n, profile))
        if len(able) >= profile.nodes and (best is None or (len(able), domain) < best[:2]):
            best = (len(able), domain, able)
    if best is None:
        room.no_domain[(cls, *shape)] = (room.version.get(cls, 0), profile.nodes)
        return None
    _, domain, able = best
    able = list(able)
    # Full-bandwidth trays first, then the tightest, so whole trays stay whole.
    able.sort(key=lambda n: (n.degraded, n.free[cls], n.name))
    chosen = _swap_in_holders(room, model, able[: profile.nodes], able[profile.nodes :])
    return _shards(room, model, profile, chosen, nvlink_domain=domain)


def _place_over_fabric(room: Room, model: str, profile: ProfileSpec) -> NewReplica | None:
    """Inside one InfiniBand fabric, on entirely free nodes: never across two fabrics.

    Fabrics are tried smallest first, so a small replica does not break up the
    one fabric large enough for a large one.
    """
    cls = profile.gpu_class
    fabrics = room.whole_free.get(cls, {})
    shape = (profile.pool, profile.engine, profile.gpus)
    for fabric in sorted(fabrics, key=lambda f: (len(fabrics[f]), f)):
        fitting = room.whole_fitting(cls, fabric, shape, lambda n: whole_node_fits(n, profile))
        if len(fitting) >= profile.nodes:
            able = [room.nodes[n] for n in itertools.islice(fitting, profile.nodes)]
            spare = (room.nodes[n] for n in sorted(room.warmth.holders(model)) if n in fabrics[fabric])
            others = [n for n in spare if n not in able and whole_node_fits(n, profile)]
            return _shards(room, model, profile, _swap_in_holders(room, model, able, others), fabric=fabric)
    return None


def _swap_in_holders(room: Room, model: str, chosen: list[NodeRoom], spare: list[NodeRoom]) -> list[NodeRoom]:
    """``chosen``, with each node that lacks the weights swapped for an interchangeable spare that holds them."""
    holders = room.warmth.holders(model)
    if not holders:
        return chosen
    spare = [n for n in spare if n.name in holders]
    out = list(chosen)
    for i, node in enumerate(out):
        if node.name in holders:
            continue
        swap = next((s for s in spare if interchangeable(node, s)), None)
        if swap is not None:
            spare.remove(swap)
            out[i] = swap
    return out


def interchangeable(a: NodeRoom, b: NodeRoom) -> bool:
    """Whether a shard may go on ``b`` instead of ``a`` without changing what the room can take afterwards.

    The same free GPUs of every class, both entirely free or neither (and on
    the same fabric when entirely free: whole nodes are indexed per fabric),
    the same NVLink domain, pool, engines and IMEX: so choosing one over the
    other for warmth never leaves the plan able to place less.
    """
    return (
        a.free == b.free
        and bool(a.used) == bool(b.used)
        and (bool(a.used) or a.info.fabric == b.info.fabric)
        and a.domain == b.domain
        and a.pool == b.pool
        and a.info.engines == b.info.engines
        and a.imex_problem == b.imex_problem
        and a.degraded == b.degraded
    )


def whole_node_fits(node: NodeRoom, profile: ProfileSpec) -> bool:
    return (
        len(node.stock[profile.gpu_class].placeable) >= profile.gpus
        and (not profile.pool or node.pool == profile.pool)
        and node.has_engine(profile.engine)
    )


def _shards(
    room: Room,
    model: str,
    profile: ProfileSpec,
    nodes: list[NodeRoom],
    *,
    nvlink_domain: str | None = None,
    fabric: str | None = None,
) -> NewReplica:
    cls = profile.gpu_class
    names = [n.name for n in nodes]
    shards = []
    for rank, node in enumerate(nodes):
        chosen, _ = pick(node.free_gpus(cls), profile.gpus)
        indices = tuple(g.index for g in chosen)
        room.take_gpus(node, cls, indices)
        env = shard_env(profile, chosen, rank=rank, nodes=names, mnnvl=nvlink_domain is not None)
        shards.append(NewShard(node=node.name, rank=rank, gpus=indices, env=env))
    return _replica(model, profile, shards, nvlink_domain=nvlink_domain, fabric=fabric)
