"""Why a profile could not be placed, in an operator's words, grouped so a big fleet stays readable.

Each reason is about the profile, a domain or fabric, or a node. When many
nodes are turned down for the same reason they become one line — "412 nodes:
no h100-80g free (h100-0001, h100-0002, h100-0003, …)" — while a reason
shared by a few nodes is kept node by node with its specifics, which is what
names the one tray of a rack that has not joined.

Explanations are computed only when placement failed, from the same index
placement uses, and cached per GPU class until that class's free capacity
changes: on a full fleet hundreds of models fail for the same reasons.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from itertools import chain, islice

from catalog.definitions import ProfileSpec
from catalog.rules import CPU_CLASS, is_mig_class
from placement.scheduling.place import memory_mb, whole_node_fits
from placement.scheduling.room import NodeRoom, Room
from placement.scheduling.types import Rejection

# A reason shared by this many nodes or fewer is listed node by node.
SPELL_OUT = 3
# A grouped reason names this many of its nodes, so there is somewhere to start looking.
EXAMPLES = 3

# (node, reason, how many nodes): a Rejection without its profile, so one
# explanation serves every profile of the same shape.
Line = tuple[str | None, str, int]
Detail = Callable[[str], str] | None


class _Group:
    """Candidates turned down for one reason: counted, with the first few kept to name."""

    __slots__ = ("count", "noun", "shown", "text")

    def __init__(self, text: str, noun: str) -> None:
        self.text, self.noun = text, noun
        self.count = 0
        self.shown: list[tuple[str, Detail]] = []


class Reasons:
    """Collects reasons in the order found, grouping those about nodes (or domains) by their group text."""

    def __init__(self) -> None:
        self._order: list[Line | _Group] = []
        self._groups: dict[tuple[str, str], _Group] = {}

    def say(self, reason: str) -> None:
        self._order.append((None, reason, 1))

    def node(self, name: str, group: str, detail: str | None = None) -> None:
        self.nodes(group, 1, (name,), None if detail is None else (lambda _n, d=detail: d))

    def nodes(self, group: str, count: int, names: Iterable[str], detail: Detail = None, noun: str = "nodes") -> None:
        """``count`` candidates turned down for ``group``; ``names`` is read only as far as it is shown.

        ``noun`` is what they are: nodes, whose lines name the node, or
        "NVLink domains", whose lines are about the domain and name no node.
        """
        if count <= 0:
            return
        g = self._groups.get((noun, group))
        if g is None:
            g = self._groups[(noun, group)] = _Group(group, noun)
            self._order.append(g)
        g.count += count
        room_left = max(SPELL_OUT, EXAMPLES) + 1 - len(g.shown)
        g.shown.extend((n, detail) for n in islice(names, room_left))

    def extend(self, lines: Iterable[Line]) -> None:
        """Lines already rendered (from a cache) go in as they are."""
        self._order.extend(lines)

    def lines(self) -> tuple[Line, ...]:
        out: list[Line] = []
        for entry in self._order:
            if not isinstance(entry, _Group):
                out.append(entry)
            elif entry.count <= SPELL_OUT:
                for name, detail in entry.shown:
                    reason = detail(name) if detail else entry.text
                    out.append((name, reason, 1) if entry.noun == "nodes" else (None, reason, 1))
            else:
                names = ", ".join(n for n, _ in entry.shown[:EXAMPLES])
                out.append((None, f"{entry.count} {entry.noun}: {entry.text} ({names}, …)", entry.count))
        return tuple(out)


def explain(room: Room, profile: ProfileSpec) -> tuple[Rejection, ...]:
    """Every reason ``profile`` could not be placed given the room as it is now."""
    problems = profile.problems()
    if problems:
        lines: tuple[Line, ...] = tuple((None, f"refused: {p}", 1) for p in problems)
    else:
        cls = profile.gpu_class
        shape = (cls, profile.engine, profile.pool or None, profile.gpus, profile.nodes, memory_mb(profile))
        key = ("explain", *shape, room.version.get(cls, 0))
        lines = room.cached(key, lambda: _explain(room, profile))  # type: ignore[assignment]
        # Many models share a profile's name and shape: the rejections themselves are kept too.
        return room.cached((*key, profile.name), lambda: _rejections(profile, lines))  # type: ignore[return-value]
    return _rejections(profile, lines)


def _rejections(profile: ProfileSpec, lines: tuple[Line, ...]) -> tuple[Rejection, ...]:
    pool = profile.pool or None
    return tuple(Rejection(profile=profile.name, pool=pool, node=n, reason=r, nodes=c) for n, r, c in lines)


def _explain(room: Room, profile: ProfileSpec) -> tuple[Line, ...]:
    r = Reasons()
    if profile.gpu_class == CPU_CLASS:
        _cpu(room, profile, r)
    else:
        _gpu(room, profile, r)
    return r.lines()


# --- shared: pool, node state, engine ---------------------------------------


def _candidates(room: Room, names: list[str], profile: ProfileSpec, r: Reasons) -> list[NodeRoom]:
    """The open nodes among ``names`` in the profile's pool with its engine; the rest explained."""
    pool, engine = profile.pool or None, profile.engine
    nodes = [room.nodes[n] for n in names]
    if pool:
        outside = [n.name for n in nodes if n.pool != pool]
        r.nodes(f"not in pool {pool}", len(outside), outside)
        nodes = [n for n in nodes if n.pool == pool]
    blocked: dict[str, list[str]] = {}
    for n in nodes:
        if n.blocked:
            blocked.setdefault(n.blocked, []).append(n.name)
    for why, names_ in blocked.items():
        r.nodes(why, len(names_), names_)
    lacking = [n for n in nodes if not n.blocked and not n.has_engine(engine)]
    r.nodes(f"engine {engine} not installed", len(lacking), (n.name for n in lacking), _engines_detail(room, engine))
    return [n for n in nodes if not n.blocked and n.has_engine(engine)]


def _engines_detail(room: Room, engine: str) -> Callable[[str], str]:
    def detail(name: str) -> str:
        has = sorted(room.nodes[name].info.engines or ())
        return f"engine {engine} not installed (has {', '.join(has) or 'none'})"

    return detail


def _static_candidates(room: Room, cls: str, profile: ProfileSpec) -> tuple[tuple[Line, ...], list[str]]:
    """Pool, state and engine reasons for a class, which no placement changes: worked out once per shape."""

    def build() -> tuple[tuple[Line, ...], list[str]]:
        r = Reasons()
        names = room.class_nodes.get(cls, []) if cls != CPU_CLASS else list(room.nodes)
        able = _candidates(room, names, profile, r)
        return r.lines(), [n.name for n in able]

    key = ("static", cls, profile.pool or None, profile.engine)
    return room.cached(key, build)  # type: ignore[return-value]


# --- GPU profiles -------------------------------------------------------------


def _gpu(room: Room, profile: ProfileSpec, r: Reasons) -> None:
    cls, need = profile.gpu_class, profile.gpus
    if not room.class_nodes.get(cls):
        r.say(f"no node has {cls} GPUs")
        _empty_mig(room, profile, r)
        return
    static, able_names = _static_candidates(room, cls, profile)
    r.extend(static)
    _empty_mig(room, profile, r)
    able = [room.nodes[n] for n in able_names]
    if not able:
        return
    most = max(len(n.stock[cls].indices) for n in able)
    if most < need:
        r.say(f"no {cls} node has {need} GPUs of that class; the most on one is {most}")
        return
    if profile.nodes <= 1:
        _capacity(room, profile, able, r)
    else:
        _domains(room, profile, able, r)
        _fabrics(room, profile, able, r)


def capacity_detail(room: Room, cls: str, need: int) -> Callable[[str], str]:
    """'no a100-80g free: 8 in use, 1 unhealthy' for one node."""

    def detail(name: str) -> str:
        node = room.nodes[name]
        st, free = node.stock[cls], node.free[cls]
        head = f"no {cls} free" if free == 0 else f"{free} {cls} free, needs {need}"
        parts = [f"{used} in use"] if (used := node.in_use(cls)) else []
        parts += [f"{n} {why}" for why, n in st.held.items()]
        text = f"{head}: {', '.join(parts)}" if parts else head
        return f"{text} ({'; '.join(st.held_examples)})" if st.held_examples else text

    return detail


def _capacity(room: Room, profile: ProfileSpec, able: list[NodeRoom], r: Reasons) -> None:
    """Single-node: read the counts off the index rather than visiting every node."""
    cls, need = profile.gpu_class, profile.gpus
    buckets = room.buckets_for(cls, profile.pool or None)
    if buckets is None:
        return
    # The index holds every open node of the pool; those without the engine
    # were explained already, and are skipped only when there are any.
    indexed = sum(len(b) for b in buckets.by_free.values())
    only = None if len(able) == indexed else {n.name for n in able}
    zero: list[dict[str, None]] = []
    few: list[dict[str, None]] = []
    for free, bucket in buckets.below(need):
        (zero if free == 0 else few).append(bucket)
    detail = capacity_detail(room, cls, need)
    for group, bucket_list in ((f"no {cls} free", zero), (f"fewer than {need} {cls} free", few)):
        if only is None:
            r.nodes(group, sum(len(b) for b in bucket_list), chain.from_iterable(bucket_list), detail)
        else:
            names = [n for n in chain.from_iterable(bucket_list) if n in only]
            r.nodes(group, len(names), names, detail)


def _empty_mig(room: Room, profile: ProfileSpec, r: Reasons) -> None:
    """For a MIG class: cards of its kind in MIG mode with nothing carved, which could take it once carved."""
    if not is_mig_class(profile.gpu_class):
        return
    card_class = profile.gpu_class.split("-mig-", 1)[0]
    for name, index in room.empty_mig.get(card_class, []):
        node = room.nodes[name]
        if not node.blocked and (not profile.pool or node.pool == profile.pool):
            detail = f"gpu {index} is in MIG mode with no instances"
            r.node(name, f"a {card_class} in MIG mode with no instances", detail)


def _domains(room: Room, profile: ProfileSpec, able: list[NodeRoom], r: Reasons) -> None:
    """How many nodes of each domain could take a shard, then what keeps the others out.

    Domains that are merely full become one line once there are many of
    them; a tray that has not joined or whose IMEX is down keeps its own line.
    """
    cls, need = profile.gpu_class, profile.gpus
    candidates = {n.name for n in able}
    domains = room.domains.get(cls, {})
    strays = room.domain_strays.get(cls, {})
    if not domains and not strays:
        r.say(f"no {cls} node is in a multi-node NVLink domain")
        return
    short: dict[str, str] = {}
    kept_out: list[tuple[str, NodeRoom, str, str]] = []
    full: list[NodeRoom] = []
    for domain in sorted(set(domains) | {d for d in strays if d}):
        members = [room.nodes[n] for n in domains.get(domain, []) if n in candidates]
        down = [n for n in members if n.imex_problem]
        busy = [n for n in members if not n.imex_problem and n.free[cls] < need]
        ready = len(members) - len(down) - len(busy)
        short[domain] = f"NVLink domain {domain}: {_n(ready, 'node')} can take a shard of {need} {cls}"
        # Grouped per domain, so one lagging tray is named even when many racks have one,
        # and a rack whose fabric manager restarted is one line rather than eighteen.
        for name in strays.get(domain, []):
            if name in candidates:
                node = room.nodes[name]
                kept_out.append((domain, node, f"not every card joined {domain}", node.domain_problem or ""))
        kept_out += [(domain, n, f"{n.imex_problem} in {domain}", n.imex_problem or "") for n in down]
        full += busy
    r.nodes(
        f"too few nodes can take a shard of {need} {cls}, needs {profile.nodes}",
        len(short),
        short,
        lambda d: f"{short[d]}, needs {profile.nodes}",
        noun="NVLink domains",
    )
    for _, node, group, detail in kept_out:
        r.node(node.name, group, detail)
    r.nodes(f"fewer than {need} {cls} free", len(full), (n.name for n in full), capacity_detail(room, cls, need))
    for name in strays.get(None, []):
        if name in candidates:
            r.node(name, "no card joined an NVLink domain", room.nodes[name].domain_problem)


def _fabrics(room: Room, profile: ProfileSpec, able: list[NodeRoom], r: Reasons) -> None:
    """Each fabric's count of entirely free nodes that fit, then why the other nodes do not."""
    cls, need = profile.gpu_class, profile.gpus
    whole_free = room.whole_free.get(cls, {})
    fitting: dict[str, int] = {}
    busy, small, no_fabric = [], [], []
    for node in able:
        fabric = node.info.fabric
        if not fabric:
            no_fabric.append(node.name)
        elif node.name not in whole_free.get(fabric, {}):
            busy.append(node.name)
        elif not whole_node_fits(node, profile):
            small.append(node.name)
        else:
            fitting[fabric] = fitting.get(fabric, 0) + 1
    fabrics = sorted({n.info.fabric for n in able if n.info.fabric})  # type: ignore[type-var]
    for fabric in fabrics:
        free = _n(fitting.get(fabric, 0), "entirely free node")
        r.say(f"InfiniBand fabric {fabric}: {free} with {need} {cls}, needs {profile.nodes}")
    total = sum(fitting.values())
    if len(fitting) > 1 and total >= profile.nodes:
        r.say(f"{total} entirely free nodes in {len(fitting)} fabrics, but a replica never spans two fabrics")
    r.nodes(
        "not entirely free",
        len(busy),
        busy,
        lambda n: f"not entirely free: {_n(len(room.nodes[n].used), 'GPU')} in use",
    )
    r.nodes(f"fewer than {need} {cls} free", len(small), small, capacity_detail(room, cls, need))
    r.nodes("no InfiniBand fabric reported", len(no_fabric), no_fabric)


def _n(count: int, thing: str) -> str:
    return f"{count} {thing}" + ("" if count == 1 else "s")


# --- CPU profiles -------------------------------------------------------------


def _cpu(room: Room, profile: ProfileSpec, r: Reasons) -> None:
    need = memory_mb(profile)
    static, able_names = _static_candidates(room, CPU_CLASS, profile)
    r.extend(static)
    if not room.nodes:
        r.say("there are no nodes")
    unknown, short = [], []
    for name in able_names:
        free = room.nodes[name].memory_free_mb
        if free is None:
            unknown.append(name)
        elif free < need:
            short.append(name)
    r.nodes("memory not reported", len(unknown), unknown)

    def detail(name: str) -> str:
        return f"{_gb(room.nodes[name].memory_free_mb or 0)} of memory free, needs {_gb(need)}"

    r.nodes(f"less than {_gb(need)} of memory free", len(short), short, detail)


def _gb(mb: int) -> str:
    text = f"{mb / 1024:.1f}".rstrip("0").rstrip(".")
    return f"{text} GB"
