"""The scheduler: a snapshot of the fleet and the catalog in, a plan out.

Pure: dataclasses in, decisions and rejections out; no Django, no ORM, no I/O
(an import contract holds it to that). The reconciler loads a
:class:`Snapshot`, calls :func:`plan`, and applies the :class:`Plan` in one
transaction. The same snapshot always gives the same plan, whatever order its
parts arrive in.

How a plan is made:

1. Index the fleet's free capacity: every GPU held by a replica in the
   snapshot (failed ones too, until stopped) is taken; open nodes (ready and
   reachable) are indexed per GPU class by free count, per fabric when
   entirely free, and per multi-node NVLink domain.
2. For each model (by name): stop failed replicas, replicas above the
   maximum, and idle ones down to the minimum; stop a drained replica whose
   replacement is ready; report stale replicas; note which replicas on
   draining nodes need a replacement. Replicas of models no longer in the
   catalog are stopped.
3. Place, in three passes so that no model's extra demand starves another's
   minimum: replacements for draining nodes first (they keep serving
   capacity), then every model up to its minimum, then up to its desired
   count. Each replica tries the model's profiles in order.
4. For a model that could not be satisfied, explain every profile: the
   reasons come from the same index, grouped per reason.

Placement rules, by profile:

- CPU (``gpu_class="cpu"``): the open node with the most free memory that
  holds ``memory_gb``, CPU-only machines first.
- One node: the tightest open node with enough healthy GPUs of the class free,
  preferring GPUs that reach each other over NVLink on as few NUMA nodes as
  that node allows. A MIG class runs on exactly one instance.
- Several nodes: inside one NVLink domain first (nodes whose every card has
  joined it and whose IMEX is up; shards get ``NCCL_MNNVL_ENABLE=1``), then
  inside one InfiniBand fabric on entirely free nodes; never across two.

Among candidates equally good by these rules, nodes that hold the model's
weights come first, then nodes on a fabric where another node holds them
(``Snapshot.weights``); a replica placed without them, when some node holds
them, says so among its model's reasons.
"""

from __future__ import annotations

from catalog.definitions import ProfileSpec
from catalog.rules import CPU_CLASS
from placement.scheduling.explain import explain
from placement.scheduling.lifecycle import ModelRound, assess, stale
from placement.scheduling.place import memory_mb, place
from placement.scheduling.room import Room
from placement.scheduling.types import (
    CORDONED,
    COUNTING_STATES,
    DRAINING,
    READY,
    STOPPING,
    GpuInfo,
    ModelInfo,
    NewReplica,
    NewShard,
    NodeInfo,
    Plan,
    Rejection,
    Replacement,
    ReplicaInfo,
    ShardInfo,
    Snapshot,
    StopDecision,
    gpu_label,
)

__all__ = [
    "CORDONED",
    "COUNTING_STATES",
    "DRAINING",
    "READY",
    "GpuInfo",
    "ModelInfo",
    "NewReplica",
    "NewShard",
    "NodeInfo",
    "Plan",
    "ProfileSpec",
    "Rejection",
    "Replacement",
    "ReplicaInfo",
    "ShardInfo",
    "Snapshot",
    "StopDecision",
    "gpu_label",
    "plan",
]


def plan(snapshot: Snapshot) -> Plan:
    """Decide what to create, stop and move, and explain what could not be placed."""
    return _Planner(snapshot).run()


class _Planner:
    def __init__(self, snapshot: Snapshot) -> None:
        self.models = {m.name: m for m in sorted(snapshot.models, key=lambda m: m.name)}
        self.replicas = sorted(snapshot.replicas, key=lambda r: r.id)
        self.node_state = {n.name: n.state for n in snapshot.nodes}
        self.held = _held_cards(snapshot.nodes)
        # Replica id → why it moves when that is a held card rather than a draining node.
        self.why_moving: dict[str, str] = {}
        self.now = snapshot.now
        self.room = Room(snapshot.nodes, self.replicas, self._cpu_mb, snapshot.weights)
        self.create: list[NewReplica] = []
        self.replace: list[Replacement] = []
        self.stop: list[StopDecision] = []
        self.rejections: dict[str, list[Rejection]] = {}
        self.unplaceable: set[str] = set()
        self.exhausted: set[str] = set()

    def _cpu_mb(self, replica: ReplicaInfo) -> int:
        """Memory a replica holds on each of its nodes: its CPU profile's, as the catalog has it now."""
        model = self.models.get(replica.model)
        profile = next((p for p in model.profiles if p.name == replica.profile), None) if model else None
        return memory_mb(profile) if profile is not None and profile.gpu_class == CPU_CLASS else 0

    def _draining_node(self, replica: ReplicaInfo) -> str | None:
        """The node a replica must leave: a draining one, or one where card health holds a card it uses."""
        node = next((s.node for s in replica.shards if self.node_state.get(s.node) == DRAINING), None)
        if node is not None:
            return node
        for s in replica.shards:
            held = next((self.held[(s.node, g)] for g in s.gpus if (s.node, g) in self.held), None)
            if held is not None:
                self.why_moving[replica.id] = f"a card it uses on node {s.node} is held: {held}"
                return s.node
        return None

    def run(self) -> Plan:
        by_model: dict[str, list[ReplicaInfo]] = {}
        for r in self.replicas:
            by_model.setdefault(r.model, []).append(r)
        for name in sorted(set(by_model) - set(self.models)):
            for r in by_model[name]:
                if r.state != STOPPING:
                    self.stop.append(StopDecision(replica_id=r.id, model=name, reason="model no longer in the catalog"))
        rounds = [assess(m, by_model.get(m.name, []), self._draining_node, self.now) for m in self.models.values()]
        parked = {m.name: m.parked_error for m in self.models.values() if m.parked_error is not None}
        for rnd in rounds:
            self.stop.extend(rnd.stops)
        active = [rnd for rnd in rounds if rnd.model.name not in parked]
        for rnd in active:
            for old, node in rnd.moves:
                self._move(rnd.model, old, node)
        for rnd in active:
            self._fill(rnd, rnd.short_of_min)
        for rnd in active:
            self._fill(rnd, rnd.short)
        for name, error in parked.items():
            self.rejections.setdefault(name, []).insert(0, _parked(name, error))
        return Plan(
            create=tuple(self.create),
            stop=tuple(self.stop),
            replace=tuple(self.replace),
            stale=tuple(stale(self.models, self.replicas)),
            rejections={m: tuple(lines) for m, lines in sorted(self.rejections.items())},
            unplaceable=tuple(sorted(self.unplaceable)),
            parked=parked,
        )

    def _place(self, model: ModelInfo) -> NewReplica | None:
        """One replica of ``model`` on its first profile that fits, or None with the reasons recorded."""
        if model.name in self.exhausted:
            return None
        for profile in model.profiles:
            if _refused(profile):
                continue
            replica = place(self.room, model.name, profile)
            if replica is not None:
                self._note_cold(model, profile, replica)
                return replica
        # Capacity only shrinks while planning, so a model that fitted nowhere
        # now will fit nowhere later in this plan either.
        self.exhausted.add(model.name)
        lines = self.rejections.setdefault(model.name, [])
        if not model.profiles:
            lines.append(Rejection(profile="", pool=None, node=None, reason="the model has no profiles"))
        for profile in model.profiles:
            lines.extend(explain(self.room, profile))
        return None

    def _note_cold(self, model: ModelInfo, profile: ProfileSpec, replica: NewReplica) -> None:
        """Say so when a replica had to go where its weights are not, though some node holds them."""
        note = self.room.warmth.note(model.name, replica.nodes)
        if note is None:
            return
        node = replica.nodes[0] if len(replica.nodes) == 1 else None
        line = Rejection(profile=profile.name, pool=profile.pool or None, node=node, reason=note)
        self.rejections.setdefault(model.name, []).append(line)

    def _move(self, model: ModelInfo, old: ReplicaInfo, node: str) -> None:
        replica = self._place(model)
        if replica is not None:
            why = self.why_moving.get(old.id, f"node {node} is draining")
            self.replace.append(Replacement(old_replica_id=old.id, new=replica, reason=why))
            return
        where = "a held card of" if old.id in self.why_moving else "draining node"
        reason = f"replica {old.id} on {where} {node} has nowhere to move, so it keeps running"
        self.rejections.setdefault(model.name, []).insert(0, Rejection(profile="", pool=None, node=node, reason=reason))

    def _fill(self, rnd: ModelRound, wanted: int) -> None:
        for _ in range(wanted):
            replica = self._place(rnd.model)
            if replica is None:
                self.unplaceable.add(rnd.model.name)
                return
            self.create.append(replica)
            rnd.count += 1


def _held_cards(nodes: tuple[NodeInfo, ...]) -> dict[tuple[str, int], str]:
    """(node, GPU index) → why card health holds it; a held card's MIG instances are held with it."""
    out: dict[tuple[str, int], str] = {}
    for n in nodes:
        cards = {g.index: g.held for g in n.gpus if g.held is not None}
        for g in n.gpus:
            reason = g.held or (cards.get(g.parent) if g.parent is not None else None)
            if reason is not None:
                out[(n.name, g.index)] = reason
    return out


def _refused(profile: ProfileSpec) -> bool:
    """A profile catalog validation would refuse is refused here too.

    A MIG class asking for more than one instance, say: the catalog may hold
    rows written before the rule, and the reasons go in the explanation.
    """
    return bool(profile.problems())


def _parked(model: str, error: str) -> Rejection:
    reason = (
        f"parked: its replicas failed at every start, last with {error!r}; "
        "nothing is placed for it until an operator unparks it"
    )
    return Rejection(profile="", pool=None, node=None, reason=reason)
