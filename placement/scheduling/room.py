"""The free-capacity index: which GPUs and how much memory are free where.

Built once per plan from the snapshot and updated as each placement is made,
so placing a replica looks at the few nodes that could take it rather than at
the whole fleet. Open nodes (ready and reachable) are indexed per GPU class by
how many placeable GPUs of that class they have free; the scheduler takes the
tightest node that fits, which keeps whole nodes whole for the replicas that
need them. Entirely free nodes are indexed per class and InfiniBand fabric,
and nodes that joined a multi-node NVLink domain per class and domain.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, insort
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from agent import nvlink_rules
from catalog.rules import CPU_CLASS
from placement.scheduling.types import (
    CORDONED,
    DRAINING,
    READY,
    GpuInfo,
    NodeInfo,
    ReplicaInfo,
    gpu_label,
)
from placement.scheduling.warmth import Warmth

# How many of a node's problems one reason spells out before "…".
PROBLEMS_SHOWN = 3


@dataclass(slots=True)
class ClassStock:
    """One node's GPUs of one class: the placeable ones and why the rest are held back."""

    indices: list[int] = field(default_factory=list)
    placeable: list[GpuInfo] = field(default_factory=list)
    # Reason ("unhealthy", "in MIG mode", …) → how many GPUs it holds back.
    held: dict[str, int] = field(default_factory=dict)
    # A few of the GPUs' own words, e.g. "gpu 3: Xid 79".
    held_examples: list[str] = field(default_factory=list)


class NodeRoom:
    """A node as the scheduler sees it while planning: what is left and why it may not take work."""

    __slots__ = (
        "blocked",
        "domain",
        "domain_hint",
        "domain_problem",
        "empty_mig_cards",
        "free",
        "has_gpus",
        "ideal",
        "imex_problem",
        "info",
        "memory_free_mb",
        "name",
        "pool",
        "stock",
        "used",
    )

    def __init__(self, info: NodeInfo, used: set[int], memory_used_mb: int) -> None:
        self.info = info
        self.name = info.name
        self.pool: str | None = info.labels.get("pool") or None
        self.blocked = blocked_reason(info)
        self.used = used
        self.has_gpus = bool(info.gpus)
        self.stock, self.empty_mig_cards = _stock(info.gpus)
        self.free = {
            cls: sum(1 for g in st.placeable if g.index not in used) if used else len(st.placeable)
            for cls, st in self.stock.items()
        }
        self.memory_free_mb = (
            None if info.memory_mb is None else info.memory_mb - info.memory_reserved_mb - memory_used_mb
        )
        self.domain, self.domain_hint, self.domain_problem = _domain(info.gpus)
        self.imex_problem = _imex_problem(info)
        # (class, gpus) → the best quality this node could offer even when empty.
        self.ideal: dict[tuple[str, int], tuple[bool, int]] = {}

    def free_gpus(self, cls: str) -> list[GpuInfo]:
        used = self.used
        return [g for g in self.stock[cls].placeable if g.index not in used]

    def has_engine(self, engine: str) -> bool:
        """Unknown engines (an agent older than the probe) are not "none": such a node may have it."""
        return self.info.engines is None or engine in self.info.engines

    def in_use(self, cls: str) -> int:
        return sum(1 for i in self.stock[cls].indices if i in self.used)

    @property
    def degraded(self) -> bool:
        """Joined but with reduced NVLink bandwidth on some card (amber on the rack page)."""
        return any(g.degraded for g in self.info.gpus if g.parent is None)


def blocked_reason(node: NodeInfo) -> str | None:
    """Why nothing new may land on a node, or None when it is open."""
    if not node.reachable:
        return "unreachable"
    if node.state == READY:
        return node.flapping
    if node.state == CORDONED:
        return "cordoned: takes nothing new"
    if node.state == DRAINING:
        return "draining: takes nothing new, its replicas are being moved"
    return f"state {node.state!r}: takes nothing new"


def _stock(gpus: tuple[GpuInfo, ...]) -> tuple[dict[str, ClassStock], list[tuple[str, int]]]:
    """Sort a node's GPUs by class into placeable and held back; also the MIG cards with nothing carved."""
    parents = {g.parent for g in gpus if g.parent is not None}
    stock: dict[str, ClassStock] = {}
    empty_mig: list[tuple[str, int]] = []
    for g in sorted(gpus, key=lambda g: g.index):
        st = stock.get(g.gpu_class)
        if st is None:
            st = stock[g.gpu_class] = ClassStock()
        st.indices.append(g.index)
        why = _held_back(g, parents)
        if why is None:
            st.placeable.append(g)
            continue
        st.held[why] = st.held.get(why, 0) + 1
        if why == "unhealthy" and (g.held or g.problems) and len(st.held_examples) < 2:
            st.held_examples.append(f"gpu {gpu_label(g.index)}: {g.held or g.problems[0]}")
        if why == "in MIG mode with no instances":
            empty_mig.append((g.gpu_class, g.index))
    return stock, empty_mig


def _held_back(g: GpuInfo, parents: set[int]) -> str | None:
    if g.held is not None or not g.healthy:
        return "unhealthy"
    if g.parent is None and g.index in parents:
        # A card in MIG mode is placed only through its instances.
        return "in MIG mode"
    if g.parent is None and g.mig_mode:
        return "in MIG mode with no instances"
    if g.parent is not None and not g.mig_uuid:
        # Without its MIG UUID the engine cannot be pointed at the instance.
        return "without a MIG UUID"
    return None


def _card_problem(g: GpuInfo, hint: str | None) -> str | None:
    """Why one card has not joined the domain ``hint``, or None when it has."""
    state = g.fabric_state.strip()
    if not nvlink_rules.has_fabric(state):
        return f"gpu {g.index} reports no fabric"
    if not nvlink_rules.completed(state):
        return f"gpu {g.index} fabric state {state}"
    if not nvlink_rules.registered(state, g.fabric_status):
        return f"gpu {g.index} fabric status {g.fabric_status.strip() or 'not reported'}"
    if g.domain is None:
        return f"gpu {g.index} joined no domain"
    if g.domain != hint:
        return f"gpu {g.index} joined {g.domain}"
    return None


def _domain(gpus: tuple[GpuInfo, ...]) -> tuple[str | None, str | None, str | None]:
    """(domain every card joined, domain some cards joined, why the node is not in it).

    A node is in a domain only when every card has joined it. A node none of
    whose cards even tries (no fabric, or a single machine's NVSwitch with its
    all-zero ClusterUUID) is simply not a domain node: no problem is reported,
    or every HGX box would be explained as a broken rack.
    """
    cards = [g for g in gpus if g.parent is None]
    if not cards:
        return None, None, None
    if len({(g.fabric_state, g.fabric_status, g.domain) for g in cards}) == 1:
        # Every card reports the same (most nodes): one card's answer is the node's, unless
        # there is a problem worth spelling out card by card, below.
        g = cards[0]
        hint = g.domain if g.domain and nvlink_rules.registered(g.fabric_state, g.fabric_status) else None
        if _card_problem(g, hint) is None:
            return hint, hint, None
        if hint is None and not nvlink_rules.trying(g.fabric_state, g.fabric_status):
            return None, None, None
    joined_to: dict[str, int] = {}
    for g in cards:
        if g.domain and nvlink_rules.registered(g.fabric_state, g.fabric_status):
            joined_to[g.domain] = joined_to.get(g.domain, 0) + 1
    # The domain most cards joined is the one the node belongs with; by name on a tie.
    hint = min(joined_to, key=lambda d: (-joined_to[d], d)) if joined_to else None
    problems = [p for g in cards if (p := _card_problem(g, hint))]
    if not problems:
        return hint, hint, None
    trying = any(nvlink_rules.trying(g.fabric_state, g.fabric_status) for g in cards)
    if hint is None and not trying:
        return None, None, None
    shown = "; ".join(problems[:PROBLEMS_SHOWN]) + ("; …" if len(problems) > PROBLEMS_SHOWN else "")
    where = f" {hint}" if hint else ""
    return None, hint, f"{joined_to.get(hint, 0) if hint else 0} of {len(cards)} cards joined{where}; {shown}"


def _imex_problem(node: NodeInfo) -> str | None:
    """Why a node cannot share GPU memory with other nodes over NVLink, or None.

    Unknown is a problem here, unlike for engines: a multi-node replica on a
    node without IMEX fails at start, and InfiniBand is there to fall back on.
    """
    if node.imex_state is None:
        return "IMEX state not reported"
    if node.imex_state.strip().lower() != "up":
        return f"IMEX {node.imex_state.strip() or 'not running'}"
    if node.imex_channels == 0:
        return "IMEX has no channel"
    return None


class Buckets:
    """Open nodes by how many GPUs of one class they have free, tightest first."""

    __slots__ = ("by_free",)

    def __init__(self) -> None:
        self.by_free: dict[int, dict[str, None]] = {}

    def add(self, name: str, free: int) -> None:
        self.by_free.setdefault(free, {})[name] = None

    def move(self, name: str, old: int, new: int) -> None:
        bucket = self.by_free[old]
        del bucket[name]
        if not bucket:
            del self.by_free[old]
        self.add(name, new)

    def remove(self, name: str, free: int) -> None:
        bucket = self.by_free[free]
        del bucket[name]
        if not bucket:
            del self.by_free[free]

    def insert(self, name: str, free: int) -> None:
        """Add a node where a fresh build would have put it: in name order (only before any move)."""
        self.by_free[free] = _sorted_in(self.by_free.get(free, {}), name)

    def at_least(self, need: int) -> Iterator[str]:
        """Nodes with ``need`` or more free, tightest first; within a bucket, in the order they arrived."""
        for free in sorted(f for f in self.by_free if f >= need):
            yield from self.by_free[free]

    def below(self, need: int) -> list[tuple[int, dict[str, None]]]:
        return [(f, self.by_free[f]) for f in sorted(self.by_free) if f < need]


def _sorted_in(names: dict[str, None], name: str) -> dict[str, None]:
    """``names`` (in name order) with ``name`` added at its place."""
    keys = list(names)
    keys.insert(bisect_left(keys, name), name)
    return dict.fromkeys(keys)


class MemoryHeap:
    """Nodes by free memory, most first: CPU replicas are spread, since memory bandwidth is what they run on."""

    __slots__ = ("heap",)

    def __init__(self, entries: Iterable[tuple[int, str]]) -> None:
        self.heap = [(-free, name) for free, name in entries]
        heapq.heapify(self.heap)

    def take_first(self, need_mb: int, accept: Callable[[str], bool]) -> str | None:
        """Remove and return the roomiest node with ``need_mb`` free that ``accept`` takes; the caller re-adds it."""
        skipped: list[tuple[int, str]] = []
        found = None
        while self.heap and -self.heap[0][0] >= need_mb:
            entry = heapq.heappop(self.heap)
            if accept(entry[1]):
                found = entry[1]
                break
            skipped.append(entry)
        for entry in skipped:
            heapq.heappush(self.heap, entry)
        return found

    def add(self, name: str, free: int) -> None:
        heapq.heappush(self.heap, (-free, name))

    def remove(self, name: str, free: int) -> bool:
        """Take out the node's entry at ``free``; False when it is not there. Linear: rare (a warmth swap)."""
        try:
            self.heap.remove((-free, name))
        except ValueError:
            return False
        heapq.heapify(self.heap)
        return True


class Room:
    """The whole fleet's free capacity, kept current as the plan takes GPUs and memory."""

    def __init__(
        self,
        nodes: Iterable[NodeInfo],
        replicas: Iterable[ReplicaInfo],
        cpu_mb: Callable[[ReplicaInfo], int],
        weights: Mapping[str, Collection[str]] | None = None,
    ) -> None:
        """``weights``: model name → the nodes holding a complete copy of its weights (``Snapshot.weights``)."""
        used: dict[str, set[int]] = {}
        memory: dict[str, int] = {}
        for r in replicas:
            # Every replica in the snapshot holds its GPUs, failed ones included:
            # their processes may still hold memory until they are stopped.
            mb = cpu_mb(r)
            for s in r.shards:
                used.setdefault(s.node, set()).update(s.gpus)
                memory[s.node] = memory.get(s.node, 0) + mb
        self.nodes: dict[str, NodeRoom] = {}
        for info in sorted(nodes, key=lambda n: n.name):
            self.nodes[info.name] = NodeRoom(info, used.get(info.name, set()), memory.get(info.name, 0))
        self.warmth = Warmth(weights or {}, {name: n.info.fabric for name, n in self.nodes.items()})
        # Every change to a class's free GPUs bumps its version, so an
        # explanation computed for it can be reused until something changes.
        self.version: dict[str, int] = {}
        self._cache: dict[tuple, object] = {}
        # NVLink domain → a count bumped whenever one of its nodes loses free GPUs, and the
        # domain nodes able to take a shard of a profile's shape, rebuilt only for a domain that moved.
        self.domain_version: dict[str, int] = {}
        self._domain_able: dict[tuple, dict[str, tuple[int, list[NodeRoom]]]] = {}
        # (class, fabric) → the subsets of ``whole_free`` fitting a profile's shape, kept as nodes leave it.
        self._whole_fit: dict[tuple[str, str], dict[tuple, dict[str, None]]] = {}
        # (class, pool, engine, GPUs a shard) → (class version, nodes) when no domain had that many able nodes.
        self.no_domain: dict[tuple, tuple[int, int]] = {}
        # Set once a plan takes GPUs or memory: the room then no longer describes its snapshot alone.
        self.taken = False
        self._index_classes()
        self._index_memory()

    # --- building ---

    def _index_classes(self) -> None:
        self.class_nodes: dict[str, list[str]] = {}
        self.buckets: dict[str, dict[str | None, Buckets]] = {}
        self.whole_free: dict[str, dict[str, dict[str, None]]] = {}
        self.domains: dict[str, dict[str, list[str]]] = {}
        self.domain_strays: dict[str, dict[str | None, list[str]]] = {}
        self.empty_mig: dict[str, list[tuple[str, int]]] = {}
        for node in self.nodes.values():
            for card_class, index in node.empty_mig_cards:
                self.empty_mig.setdefault(card_class, []).append((node.name, index))
            for cls in node.stock:
                self.class_nodes.setdefault(cls, []).append(node.name)
                self.version.setdefault(cls, 0)
                if node.blocked:
                    continue
                self.buckets.setdefault(cls, {}).setdefault(None, Buckets()).add(node.name, node.free[cls])
                if node.info.fabric and not node.used:
                    self.whole_free.setdefault(cls, {}).setdefault(node.info.fabric, {})[node.name] = None
                if node.domain:
                    self.domains.setdefault(cls, {}).setdefault(node.domain, []).append(node.name)
                elif node.domain_problem:
                    self.domain_strays.setdefault(cls, {}).setdefault(node.domain_hint, []).append(node.name)

    def _index_memory(self) -> None:
        self.version.setdefault(CPU_CLASS, 0)
        known = [n for n in self.nodes.values() if not n.blocked and n.memory_free_mb is not None]
        # CPU-only machines first: a GPU machine's memory is better left to its GPU replicas.
        self.memory_cpu_only = MemoryHeap((n.memory_free_mb or 0, n.name) for n in known if not n.has_gpus)
        self.memory_gpu_nodes = MemoryHeap((n.memory_free_mb or 0, n.name) for n in known if n.has_gpus)

    # --- lookups ---

    def buckets_for(self, cls: str, pool: str | None) -> Buckets | None:
        """The open nodes of a class (in a pool) by free count, built for a pool the first time one asks."""
        per_pool = self.buckets.get(cls)
        if per_pool is None:
            return None
        if pool not in per_pool:
            b = Buckets()
            for name in per_pool[None].at_least(0):
                node = self.nodes[name]
                if node.pool == pool:
                    b.add(name, node.free[cls])
            per_pool[pool] = b
        return per_pool[pool]

    def domain_able(self, cls: str, domain: str, shape: tuple, ready: Callable[[NodeRoom], bool]) -> list[NodeRoom]:
        """The nodes of ``domain`` that ``ready`` accepts, in index order; ``shape`` names what ``ready`` tests.

        Kept per domain and rebuilt only once one of the domain's nodes has had GPUs taken: a
        multi-node placement looks at every domain, and all but one are as they were last time.
        """
        per_domain = self._domain_able.setdefault((cls, *shape), {})
        version = self.domain_version.get(domain, 0)
        seen = per_domain.get(domain)
        if seen is None or seen[0] != version:
            able = [n for name in self.domains[cls][domain] if ready(n := self.nodes[name])]
            seen = per_domain[domain] = (version, able)
        return seen[1]

    def whole_fitting(self, cls: str, fabric: str, shape: tuple, fits: Callable[[NodeRoom], bool]) -> dict[str, None]:
        """The entirely free nodes of ``fabric`` that ``fits`` accepts, in index order.

        ``fits`` must depend only on what a node is, never on what it has free (``shape``
        names what it tests): the subset is filtered once, then loses each node as
        ``take_gpus`` takes it out of ``whole_free``.
        """
        per_shape = self._whole_fit.setdefault((cls, fabric), {})
        subset = per_shape.get(shape)
        if subset is None:
            names = self.whole_free.get(cls, {}).get(fabric, {})
            subset = per_shape[shape] = {n: None for n in names if fits(self.nodes[n])}
        return subset

    def cached(self, key: tuple, build: Callable[[], object]) -> object:
        if key not in self._cache:
            self._cache[key] = build()
        return self._cache[key]

    # --- taking ---

    # --- patching (placement.scheduler.Planner) ---

    def patch(self, info: NodeInfo, used: set[int], memory_used_mb: int) -> None:
        """Make the room what a fresh one would be with this node (one already in it) as given.

        Only for a room no plan has taken from. Every index keeps the order a fresh build gives it
        (by node name), and every cached answer about a class the node has, had, or feeds
        (a MIG class through its card class; CPU explanations through every node) is dropped.
        """
        assert not self.taken, "a room a plan has taken from cannot be patched"
        old = self.nodes[info.name]
        new = NodeRoom(info, used, memory_used_mb)
        self._unindex(old)
        self.nodes[info.name] = new
        self._reindex(new)
        cards = {c for c, _ in old.empty_mig_cards} | {c for c, _ in new.empty_mig_cards}
        classes = set(old.stock) | set(new.stock) | {CPU_CLASS}
        classes |= {c for c in self.version if c.split("-mig-", 1)[0] in cards}
        # A MIG class no node has yet is in no index, only in the cache: its explanation names the
        # empty cards that could take it once carved, and this node's may have come, gone or gone dark.
        classes |= {k[1] for k in self._cache if isinstance(k[1], str) and k[1].split("-mig-", 1)[0] in cards}
        for cls in classes:
            self.version[cls] = self.version.get(cls, 0) + 1
            per_pool = self.buckets.get(cls, {})
            for pool in [p for p in per_pool if p is not None]:
                del per_pool[pool]
        self._cache = {k: v for k, v in self._cache.items() if not (k[0] in ("static", "explain") and k[1] in classes)}
        for n in (old, new):
            if n.domain:
                self.domain_version[n.domain] = self.domain_version.get(n.domain, 0) + 1
            for cls in set(old.stock) | set(new.stock):
                self._whole_fit.pop((cls, n.info.fabric or ""), None)
        self.warmth.moved(info.name, info.fabric)

    def _unindex(self, node: NodeRoom) -> None:
        name = node.name
        for card_class, index in node.empty_mig_cards:
            self.empty_mig[card_class].remove((name, index))
        for cls in node.stock:
            self.class_nodes[cls].remove(name)
            if node.blocked:
                continue
            self.buckets[cls][None].remove(name, node.free[cls])
            self.whole_free.get(cls, {}).get(node.info.fabric or "", {}).pop(name, None)
            if node.domain:
                self.domains[cls][node.domain].remove(name)
            elif node.domain_problem:
                self.domain_strays[cls][node.domain_hint].remove(name)
        if not node.blocked and node.memory_free_mb is not None:
            heap = self.memory_gpu_nodes if node.has_gpus else self.memory_cpu_only
            heap.remove(name, node.memory_free_mb)
        self._prune()

    def _prune(self) -> None:
        """Drop what emptied, as a fresh build would never have made it."""
        for index in (self.empty_mig, self.class_nodes):
            for key in [k for k, v in index.items() if not v]:
                del index[key]
        for cls in [c for c, per_pool in self.buckets.items() if not per_pool[None].by_free]:
            del self.buckets[cls]
        for nested in (self.whole_free, self.domains, self.domain_strays):
            for cls, inner in list(nested.items()):
                for key in [k for k, v in inner.items() if not v]:
                    del inner[key]
                if not inner:
                    del nested[cls]

    def _reindex(self, node: NodeRoom) -> None:
        name = node.name
        for card_class, index in node.empty_mig_cards:
            insort(self.empty_mig.setdefault(card_class, []), (name, index))
        for cls in node.stock:
            insort(self.class_nodes.setdefault(cls, []), name)
            self.version.setdefault(cls, 0)
            if node.blocked:
                continue
            self.buckets.setdefault(cls, {}).setdefault(None, Buckets()).insert(name, node.free[cls])
            if node.info.fabric and not node.used:
                per_fabric = self.whole_free.setdefault(cls, {})
                per_fabric[node.info.fabric] = _sorted_in(per_fabric.get(node.info.fabric, {}), name)
            if node.domain:
                insort(self.domains.setdefault(cls, {}).setdefault(node.domain, []), name)
            elif node.domain_problem:
                insort(self.domain_strays.setdefault(cls, {}).setdefault(node.domain_hint, []), name)
        if not node.blocked and node.memory_free_mb is not None:
            heap = self.memory_gpu_nodes if node.has_gpus else self.memory_cpu_only
            heap.add(name, node.memory_free_mb)

    def take_gpus(self, node: NodeRoom, cls: str, indices: tuple[int, ...]) -> None:
        self.taken = True
        was_whole = not node.used
        node.used.update(indices)
        old = node.free[cls]
        node.free[cls] = new = old - len(indices)
        per_pool = self.buckets[cls]
        for pool in (None, node.pool) if node.pool else (None,):
            if pool in per_pool:
                per_pool[pool].move(node.name, old, new)
        self.version[cls] += 1
        if node.domain:
            self.domain_version[node.domain] = self.domain_version.get(node.domain, 0) + 1
        if was_whole and node.info.fabric:
            for c in node.stock:
                self.whole_free.get(c, {}).get(node.info.fabric, {}).pop(node.name, None)
                for subset in self._whole_fit.get((c, node.info.fabric), {}).values():
                    subset.pop(node.name, None)
                self.version[c] += 1

    def take_memory(self, node: NodeRoom, mb: int) -> None:
        self.taken = True
        node.memory_free_mb = (node.memory_free_mb or 0) - mb
        heap = self.memory_gpu_nodes if node.has_gpus else self.memory_cpu_only
        heap.add(node.name, node.memory_free_mb)
        self.version[CPU_CLASS] += 1
