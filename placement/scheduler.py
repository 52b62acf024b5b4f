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

Round after round, :class:`Planner` gives the same plans while rebuilding only
what changed since the last snapshot; that it equals :func:`plan` on every
snapshot is a promise (tests/placement/test_planner_incremental.py).

Among candidates equally good by these rules, nodes that hold the model's
weights come first, then nodes on a fabric where another node holds them
(``Snapshot.weights``); a replica placed without them, when some node holds
them, says so among its model's reasons.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from catalog.definitions import ProfileSpec
from catalog.rules import CPU_CLASS
from placement.scheduling.explain import explain
from placement.scheduling.lifecycle import ModelRound, assess, idle_seconds, stale
from placement.scheduling.place import memory_mb, place
from placement.scheduling.room import Room
from placement.scheduling.types import (
    CORDONED,
    COUNTING_STATES,
    DRAINING,
    READY,
    REPLICA_READY,
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
    "Planner",
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


PATCH_AT_MOST = 500
"""More nodes changed than this since the last round, and the room is built afresh instead of patched.

A node patched in costs its share of every index it is in, which grows with
the fleet; a fresh room costs the fleet once. At 10,000 nodes all coming back
from a partition together, patching each was 3.2 s of the reconcile's CPU and
a fresh room well under one; either gives the same plan.
"""


class Planner:
    """:func:`plan`, round after round, reusing what the last round built wherever nothing it read changed.

    ``Planner().plan(snapshot) == plan(snapshot)`` for every snapshot, whatever came before it
    (tests/placement/test_planner_incremental.py). What is kept from the last snapshot:

    - the room (step 1), as long as that round's plan took nothing from it: the nodes that
      changed, and those whose replicas did, are patched into it (``Room.patch``);
    - each model's assessment (step 2), as long as its catalog entry, its replicas and the nodes
      they are on are as they were, and ``now`` has not reached the first moment one of its
      replicas would turn idle (a round with an idle replica is assessed again whenever ``now`` moves).

    Anything else — the first round, a round after one that placed something, a node added or
    removed, more than ``PATCH_AT_MOST`` nodes changed, a model added, removed or with other
    profiles, other weights, ``now`` going back — is planned in full. Placing (step 3) and
    explaining (step 4) always run, on the kept room, so the greedy order across models is the
    full plan's own. ``incremental`` says which it was.
    """

    def __init__(self) -> None:
        self.incremental = False
        self._snapshot: Snapshot | None = None
        self._room: Room | None = None

    def plan(self, snapshot: Snapshot) -> Plan:
        changed = self._changes(snapshot)
        if changed is None:
            return self._full(snapshot)
        nodes, replicas = changed
        self.incremental = True
        return self._follow(snapshot, nodes, replicas)

    # --- what changed ---

    def _changes(self, snapshot: Snapshot) -> tuple[list[NodeInfo], dict[str, ReplicaInfo | None]] | None:
        """(changed nodes, replicas added, removed (None) or changed by id), or None when only a full plan will do."""
        old = self._snapshot
        if old is None or self._room is None or self._room.taken or snapshot.now < old.now:
            return None
        if snapshot.weights is not old.weights and snapshot.weights != old.weights:
            return None
        if snapshot.models is not old.models:
            before = {m.name: m.profiles for m in old.models}
            after = {m.name: m.profiles for m in snapshot.models}
            if before.keys() != after.keys() or any(after[n] is not p and after[n] != p for n, p in before.items()):
                return None
        nodes: list[NodeInfo] = []
        if snapshot.nodes is not old.nodes:
            if not len(snapshot.nodes) == len(old.nodes) == len(self._infos):
                return None
            # The same nodes in the same order, most of them the very same objects: compare those that are not.
            for info, was in zip(snapshot.nodes, old.nodes, strict=True):
                if info is was:
                    continue
                if info.name != was.name:
                    return None
                if info != self._infos[info.name]:
                    nodes.append(info)
            if len(nodes) > PATCH_AT_MOST:
                return None
        replicas: dict[str, ReplicaInfo | None] = {}
        if snapshot.replicas is not old.replicas:
            pairs = zip(snapshot.replicas, old.replicas, strict=False)
            if len(snapshot.replicas) == len(old.replicas) and all(a.id == b.id for a, b in pairs if a is not b):
                # The same replicas in the same order, a few of them changed: no need to match ids.
                replicas = {
                    a.id: a for a, b in zip(snapshot.replicas, old.replicas, strict=True) if a is not b and a != b
                }
            else:
                now = {r.id: r for r in snapshot.replicas}
                for rid in now.keys() | self._replicas.keys():
                    a, b = self._replicas.get(rid), now.get(rid)
                    if a is not b and a != b:
                        replicas[rid] = b
        return nodes, replicas

    # --- a full plan, and what it leaves to reuse ---

    def _full(self, snapshot: Snapshot) -> Plan:
        self.incremental = False
        planner = _Planner(snapshot)
        self._room = planner.room
        self._infos = {n.name: n for n in snapshot.nodes}
        self._replicas = {r.id: r for r in planner.replicas}
        self._by_model: dict[str, list[ReplicaInfo]] = {}
        self._on_node: dict[str, set[str]] = {}
        for r in planner.replicas:
            self._by_model.setdefault(r.model, []).append(r)
            for sh in r.shards:
                self._on_node.setdefault(sh.node, set()).add(r.id)
        self._held = planner.held
        self._states = planner.node_state
        self._assessed: dict[str, _Assessed] = {}
        result = self._run(planner, snapshot, set(self._by_model) | set(planner.models))
        self._snapshot = snapshot
        return result

    def _run(self, planner: _Planner, snapshot: Snapshot, dirty: set[str]) -> Plan:
        rounds: list[ModelRound] = []
        for name, model in planner.models.items():
            seen = self._assessed.get(name)
            if name in dirty or seen is None or not seen.holds(model, snapshot.now):
                seen = _Assessed.of(planner, model, self._by_model.get(name, []), snapshot.now)
                self._assessed[name] = seen
            planner.why_moving.update(seen.why_moving)
            rounds.append(replace(seen.round) if seen.round.short or seen.round.moves else seen.round)
        stale_ids = sorted(i for name in planner.models for i in self._assessed[name].stale)
        result = planner.finish(self._by_model, rounds, stale_ids)
        if planner.room.taken:
            self._room = None
        return result

    # --- a plan from the last one ---

    def _follow(self, snapshot: Snapshot, nodes: list[NodeInfo], replicas: dict[str, ReplicaInfo | None]) -> Plan:
        room = self._room
        assert room is not None
        touched = {n.name for n in nodes}
        dirty: set[str] = set()
        now = replicas
        for rid in replicas:
            for r in (self._replicas.get(rid), now.get(rid)):
                if r is not None:
                    dirty.add(r.model)
                    touched.update(sh.node for sh in r.shards)
        for rid in replicas:
            old = self._replicas.pop(rid, None)
            if old is not None:
                for sh in old.shards:
                    self._on_node.get(sh.node, set()).discard(rid)
            new = now.get(rid)
            if new is not None:
                self._replicas[rid] = new
                for sh in new.shards:
                    self._on_node.setdefault(sh.node, set()).add(rid)
        for name in {m for m in dirty}:
            mine = [r for r in self._by_model.get(name, []) if r.id not in replicas]
            mine += [r for rid in replicas if (r := now.get(rid)) is not None and r.model == name]
            if mine:
                self._by_model[name] = sorted(mine, key=lambda r: r.id)
            else:
                self._by_model.pop(name, None)
        for info in nodes:
            self._infos[info.name] = info
        models = {m.name: m for m in snapshot.models}
        for info in nodes:
            self._states[info.name] = info.state
        planner = _Planner(snapshot, room=room, held=self._held, states=self._states)
        for name in touched:
            info = self._infos.get(name)
            if info is None:
                continue  # a replica on a node the snapshot does not have: the room never saw it either
            on = [self._replicas[i] for i in sorted(self._on_node.get(name, ()))]
            used = {g for r in on for sh in r.shards if sh.node == name for g in sh.gpus}
            memory = sum(planner._cpu_mb(r) for r in on for sh in r.shards if sh.node == name)
            room.patch(info, used, memory)
            for key in [k for k in self._held if k[0] == name]:
                del self._held[key]
            self._held.update(_held_cards((info,)))
            dirty.update(self._replicas[i].model for i in self._on_node.get(name, ()))
        old = self._snapshot
        assert old is not None
        if snapshot.models is not old.models:
            before = {m.name: m for m in old.models}
            dirty.update(n for n, m in models.items() if before[n] is not m and before[n] != m)
        self._snapshot = snapshot
        return self._run(planner, snapshot, dirty)


@dataclass(slots=True)
class _Assessed:
    """One model's assessment and stale replicas, with what it was made from."""

    model: ModelInfo
    now: datetime
    round: ModelRound
    why_moving: dict[str, str]
    stale: list[str]
    # The assessment holds for a later ``now`` before this one (None: for any).
    until: datetime | None
    timeless: bool

    @classmethod
    def of(cls, planner: _Planner, model: ModelInfo, replicas: list[ReplicaInfo], now: datetime) -> _Assessed:
        before = set(planner.why_moving)
        rnd = assess(model, replicas, planner._draining_node, now)
        why = {i: planner.why_moving[i] for i in planner.why_moving.keys() - before}
        until, timeless = _idle_horizon(model, replicas, now)
        return cls(model, now, rnd, why, stale({model.name: model}, replicas), until, timeless)

    def holds(self, model: ModelInfo, now: datetime) -> bool:
        if model is not self.model and model != self.model:
            return False
        if now == self.now:
            return True
        return self.timeless and (self.until is None or now < self.until)


def _idle_horizon(model: ModelInfo, replicas: list[ReplicaInfo], now: datetime) -> tuple[datetime | None, bool]:
    """(a moment before the first of ``replicas`` turns idle, whether the assessment reads ``now`` at all).

    Above the maximum and above the autoscaler's count, replicas are ordered by idleness,
    which every replica gains at the same rate: that order is the same at any ``now``. Only
    the idle rule reads the clock: an assessment with an idle replica (stopped, with its
    seconds in the reason, or kept for the minimum) is redone whenever ``now`` moves; one
    without holds until a second before the first would turn idle.
    """
    timeout = model.idle_timeout_s
    if timeout is None:
        return None, True
    ready = [r for r in replicas if r.state == REPLICA_READY]
    if any(idle_seconds(r, now) >= timeout for r in ready):
        return None, False
    sinces = [r.last_used_at or r.ready_at or r.created_at for r in ready]
    if not sinces:
        return None, True
    return min(sinces) + timedelta(seconds=timeout) - timedelta(seconds=1), True


class _Planner:
    def __init__(
        self, snapshot: Snapshot, room: Room | None = None, held: dict | None = None, states: dict | None = None
    ) -> None:
        """``room``, ``held`` and ``states``, when given, must be what this snapshot would build (``Planner``)."""
        self.models = {m.name: m for m in sorted(snapshot.models, key=lambda m: m.name)}
        self.replicas = sorted(snapshot.replicas, key=lambda r: r.id) if room is None else []
        self.node_state = {n.name: n.state for n in snapshot.nodes} if states is None else states
        self.held = _held_cards(snapshot.nodes) if held is None else held
        # Replica id → why it moves when that is a held card rather than a draining node.
        self.why_moving: dict[str, str] = {}
        self.now = snapshot.now
        self.room = room or Room(snapshot.nodes, self.replicas, self._cpu_mb, snapshot.weights)
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
        rounds = [assess(m, by_model.get(m.name, []), self._draining_node, self.now) for m in self.models.values()]
        return self.finish(by_model, rounds, stale(self.models, self.replicas))

    def finish(self, by_model: Mapping[str, list[ReplicaInfo]], rounds: list[ModelRound], stale_ids: list[str]) -> Plan:
        """Steps 2 (the stops) to 4 from each model's assessment, in the models' order."""
        for name in sorted(set(by_model) - set(self.models)):
            for r in by_model[name]:
                if r.state != STOPPING:
                    self.stop.append(StopDecision(replica_id=r.id, model=name, reason="model no longer in the catalog"))
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
            stale=tuple(stale_ids),
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
