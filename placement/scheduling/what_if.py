"""What if these parts of the fleet were lost: the scheduler's answer, with nothing changed.

Given the scheduler's input (a :class:`Snapshot`) and a set of nodes, the
fleet is planned twice: as it is, and as the reconciler would see it once
those nodes were lost — their replicas stopping (shards on the other nodes of
a multi-node replica keep their GPUs until stopped, as they do for real), the
nodes gone. The answer says which replicas would stop, where the plan would
put each one instead (and over what: one node, an NVLink domain, or an
InfiniBand fabric), which models would be left short and the scheduler's own
reasons why, and how long the moves take at the configured rate.

Targets name parts of the fleet the way operators do: a node's name, an
NVLink domain's key (``ClusterUUID/CliqueId``), an InfiniBand fabric's key,
or ``LABEL=VALUE`` over node labels. :func:`resolve` turns them into nodes
from the same snapshot, so what is lost is what the scheduler sees.

Pure: no Django, no I/O; the caller reads the snapshot and any other names
for domains and fabrics (a domain's name for people, a fabric's declared
name) and hands them in.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from placement.scheduler import plan
from placement.scheduling.lifecycle import desired
from placement.scheduling.types import (
    COUNTING_STATES,
    STOPPING,
    NewReplica,
    Plan,
    Rejection,
    ReplicaInfo,
    Snapshot,
)

# Kinds of target, in the order a name is tried: a node's name wins over a
# domain or fabric key that happens to be spelt the same, and LABEL=VALUE is
# tried last, so a node whose name holds "=" can still be named.
NODE = "node"
NVLINK_DOMAIN = "nvlink_domain"
FABRIC = "fabric"
LABEL = "label"

_KIND_WORDS = {NVLINK_DOMAIN: "an NVLink domain", FABRIC: "a fabric"}

# How the replacement's shards would talk to each other.
ONE_NODE = "single_node"
NVLINK = "nvlink"
INFINIBAND = "infiniband"


class UnknownTarget(ValueError):
    """A target that names nothing in the fleet; the message is the sentence an operator reads."""

    def __init__(self, target: str, message: str) -> None:
        super().__init__(message)
        self.target = target
        self.message = message


@dataclass(frozen=True, slots=True, kw_only=True)
class Target:
    """One target as given, what kind of part it named, and the nodes that part holds now."""

    text: str
    kind: str
    key: str
    nodes: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Move:
    """A replica that would stop, and where the plan would put one in its place.

    ``new`` is None when the plan places none: the model would still have
    what it wants without it (``needed`` False), or there is nowhere to put it
    (``needed`` True, and the model is among the answer's short ones), or the
    model has left the catalog (``in_catalog`` False). ``why`` says which.
    """

    replica: ReplicaInfo
    lost_nodes: tuple[str, ...]
    new: NewReplica | None
    needed: bool
    in_catalog: bool = True

    @property
    def why(self) -> str | None:
        """Why no replica takes its place, in words; None when one does."""
        if self.new is not None:
            return None
        if not self.in_catalog:
            return f"{self.replica.model} is no longer in the catalog"
        if self.needed:
            return f"{self.replica.model} has nowhere to put it: see short"
        return f"{self.replica.model} would still have the replicas it wants without it"

    @property
    def interconnect(self) -> str | None:
        """How the new replica's shards would talk: one node, one NVLink domain, or one InfiniBand fabric."""
        if self.new is None:
            return None
        if len(self.new.shards) <= 1:
            return ONE_NODE
        return NVLINK if self.new.nvlink_domain else INFINIBAND


@dataclass(frozen=True, slots=True, kw_only=True)
class Short:
    """A model the plan would leave short of what it wants, with the scheduler's reasons.

    ``wanted`` is the count it should have; ``after`` the replicas it would
    have once the plan was applied (those left serving and those placed);
    ``short_today`` says it is short already, before anything is lost.
    """

    model: str
    wanted: int
    after: int
    short_today: bool
    parked: bool
    reasons: tuple[Rejection, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class WhatIf:
    """The answer: what would stop, where it would go, who would be short, how long the moves take."""

    targets: tuple[Target, ...]
    lost: tuple[str, ...]
    moves: tuple[Move, ...]
    short: tuple[Short, ...]
    moves_per_minute: int
    plan: Plan

    @property
    def placed(self) -> int:
        """How many replacements the plan places: the moves the rate limiter lets through."""
        return sum(1 for m in self.moves if m.new is not None)

    @property
    def move_minutes(self) -> int:
        """How many one-minute windows the placed moves need at the rate: ``ceil(placed / rate)``."""
        return move_minutes(self.placed, self.moves_per_minute)


def move_minutes(moves: int, per_minute: int) -> int:
    """At most ``per_minute`` moves start in each minute, so ``moves`` of them need this many minutes."""
    if moves <= 0:
        return 0
    return math.ceil(moves / max(1, per_minute))


# --- targets ---------------------------------------------------------------------------------


def split_targets(values: Iterable[str]) -> list[str]:
    """Targets as given, several values or comma-separated ones (``a,b`` is ``a`` and ``b``), blanks dropped."""
    out: list[str] = []
    for value in values:
        for part in value.split(","):
            part = part.strip()
            if part and part not in out:
                out.append(part)
    return out


def resolve(
    texts: Iterable[str],
    snapshot: Snapshot,
    aliases: Mapping[str, tuple[str, str]] | None = None,
) -> tuple[Target, ...]:
    """Each target as the nodes it names now; :class:`UnknownTarget` for the first that names none.

    ``aliases`` maps other names of a domain or fabric (a domain's name for
    people, a fabric's id or declared name) to ``(kind, key)``.
    """
    names = frozenset(n.name for n in snapshot.nodes)
    return tuple(_resolve_one(t, snapshot, names, aliases or {}) for t in texts)


def _resolve_one(
    text: str, snapshot: Snapshot, names: frozenset[str], aliases: Mapping[str, tuple[str, str]]
) -> Target:
    if text in names:
        return Target(text=text, kind=NODE, key=text, nodes=(text,))
    kind, key = aliases.get(text, (None, text))
    if kind in (None, NVLINK_DOMAIN):
        members = _domain_nodes(snapshot, key)
        if members:
            return Target(text=text, kind=NVLINK_DOMAIN, key=key, nodes=members)
    if kind in (None, FABRIC):
        members = tuple(sorted(n.name for n in snapshot.nodes if n.fabric == key))
        if members:
            return Target(text=text, kind=FABRIC, key=key, nodes=members)
    if kind is None and "=" in text:
        label, _, value = text.partition("=")
        members = tuple(sorted(n.name for n in snapshot.nodes if n.labels.get(label.strip()) == value.strip()))
        if members:
            return Target(text=text, kind=LABEL, key=f"{label.strip()}={value.strip()}", nodes=members)
        raise UnknownTarget(text, f"no node has the label {label.strip()}={value.strip()!r}")
    if kind is not None:
        raise UnknownTarget(text, f"{text!r} names {_KIND_WORDS.get(kind, kind)} that holds no node now")
    raise UnknownTarget(
        text,
        f"{text!r} is not a node, an NVLink domain key, an InfiniBand fabric or LABEL=VALUE "
        "(`llmgw ctl nodes`, `llmgw ctl nvlink` and `llmgw ctl fabrics` list them)",
    )


def _domain_nodes(snapshot: Snapshot, key: str) -> tuple[str, ...]:
    """The nodes with a card that has joined the domain ``key``."""
    return tuple(sorted(n.name for n in snapshot.nodes if any(g.domain == key for g in n.gpus)))


# --- the answer ------------------------------------------------------------------------------


def without(snapshot: Snapshot, lost: frozenset[str]) -> Snapshot:
    """The snapshot as the reconciler would build it once ``lost`` were lost.

    The nodes are gone; a replica with a shard on one is stopping, holding
    only its shards on the nodes left (as the reconciler marks it before it
    takes the snapshot).
    """
    nodes = tuple(n for n in snapshot.nodes if n.name not in lost)
    replicas = []
    for r in snapshot.replicas:
        if not any(s.node in lost for s in r.shards):
            replicas.append(r)
            continue
        kept = tuple(s for s in r.shards if s.node not in lost)
        replicas.append(replace(r, state=STOPPING, shards=kept))
    return replace(snapshot, nodes=nodes, replicas=tuple(replicas))


def stopped_by(snapshot: Snapshot, lost: frozenset[str]) -> list[ReplicaInfo]:
    """Replicas serving or on their way that have a shard on a lost node, by id."""
    return sorted(
        (r for r in snapshot.replicas if r.state in COUNTING_STATES and any(s.node in lost for s in r.shards)),
        key=lambda r: r.id,
    )


def what_if(snapshot: Snapshot, targets: tuple[Target, ...], moves_per_minute: int) -> WhatIf:
    """The scheduler's answer for the fleet without every node the targets name."""
    lost = frozenset(n for t in targets for n in t.nodes)
    today = plan(snapshot)
    reduced = without(snapshot, lost)
    after = plan(reduced)
    stopped = stopped_by(snapshot, lost)
    creates: dict[str, list[NewReplica]] = {}
    for c in after.create:
        creates.setdefault(c.model, []).append(c)
    short_models = set(after.unplaceable) | {r.model for r in stopped if r.model in after.parked}
    catalog = {m.name for m in snapshot.models}
    moves = []
    for r in stopped:
        # The plan's new replicas of a model are all alike: each stopped one takes the next.
        queue = creates.get(r.model, [])
        new = queue.pop(0) if queue else None
        lost_here = tuple(sorted({s.node for s in r.shards if s.node in lost}))
        needed = new is not None or r.model in short_models
        moves.append(Move(replica=r, lost_nodes=lost_here, new=new, needed=needed, in_catalog=r.model in catalog))
    return WhatIf(
        targets=targets,
        lost=tuple(sorted(lost)),
        moves=tuple(moves),
        short=_shorts(reduced, after, today, short_models),
        moves_per_minute=max(1, moves_per_minute),
        plan=after,
    )


def _shorts(reduced: Snapshot, after: Plan, today: Plan, names: set[str]) -> tuple[Short, ...]:
    """Each model in ``names`` with what it wants, what it would have, and the scheduler's reasons."""
    models = {m.name: m for m in reduced.models}
    stopping = {s.replica_id for s in after.stop}
    after_count: Counter[str] = Counter(c.model for c in after.create)
    for r in reduced.replicas:
        if r.state in COUNTING_STATES and r.id not in stopping:
            after_count[r.model] += 1
    return tuple(
        Short(
            model=name,
            wanted=desired(models[name]),
            after=after_count[name],
            short_today=name in today.unplaceable or name in today.parked,
            parked=name in after.parked,
            reasons=tuple(after.rejections.get(name, ())),
        )
        for name in sorted(names)
    )
