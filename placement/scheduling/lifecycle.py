"""What each model needs this round: how many replicas, which to stop, which to move off draining nodes.

A replica and the replacement created for it while its node drains count as
one: the pair is a single replica in the middle of moving. The old one is
stopped only once the replacement is ready, so a drain never leaves the model
with fewer serving replicas than it had.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from placement.scheduling.types import (
    COUNTING_STATES,
    FAILED,
    PENDING,
    REPLICA_READY,
    STARTING,
    ModelInfo,
    ReplicaInfo,
    StopDecision,
)

# Cheapest to stop first: a replica that has not started loses nothing.
_STOP_ORDER = {PENDING: 0, STARTING: 1, REPLICA_READY: 2}


@dataclass(slots=True)
class ModelRound:
    """One model's bookkeeping for one plan."""

    model: ModelInfo
    # Replicas that count after this round's stops; a moving pair counts once.
    count: int = 0
    # How many replicas the model should have once this round is done.
    target: int = 0
    stops: list[StopDecision] = field(default_factory=list)
    # Replicas on draining nodes that need a replacement, with the node.
    moves: list[tuple[ReplicaInfo, str]] = field(default_factory=list)

    @property
    def short(self) -> int:
        return max(0, self.target - self.count)

    @property
    def short_of_min(self) -> int:
        return max(0, min(self.target, self.model.min_replicas) - self.count)


def desired(model: ModelInfo) -> int:
    """At least the minimum, at most the maximum; demand (``wanted``) or the autoscaler's count in between."""
    low = max(0, model.min_replicas)
    high = max(low, model.max_replicas)
    asked = [n for n in (model.wanted, model.scale_to) if n is not None]
    wanted = max(asked) if asked else low
    return max(low, min(high, wanted))


def idle_seconds(replica: ReplicaInfo, now: datetime) -> float:
    """How long nobody has used a replica; one never used has been idle since it became ready.

    Not since it was created: a scale-up whose start took longer than the idle
    timeout would otherwise be stopped the moment it was ready, before the
    gateway's first use of it (written every LLMGW_GATEWAY_TOUCH_EVERY_S) lands.
    """
    since = replica.last_used_at or replica.ready_at or replica.created_at
    return (now - since).total_seconds()


def stale(models: Mapping[str, ModelInfo], replicas: Iterable[ReplicaInfo]) -> list[str]:
    """Replicas placed under a profile definition the catalog no longer holds.

    One with no recorded fingerprint is not stale (that is every replica
    adopted from an older agent), nor is one whose model or profile is gone:
    those are different facts, reported elsewhere.
    """
    out = []
    for r in replicas:
        model = models.get(r.model)
        if not r.fingerprint or model is None:
            continue
        profile = next((p for p in model.profiles if p.name == r.profile), None)
        if profile is not None and profile.fingerprint != r.fingerprint:
            out.append(r.id)
    return sorted(out)


def assess(
    model: ModelInfo,
    replicas: list[ReplicaInfo],
    draining_node: Callable[[ReplicaInfo], str | None],
    now: datetime,
) -> ModelRound:
    """The model's count, target, stops and moves, from its replicas (sorted by id)."""
    rnd = ModelRound(model=model)
    for r in replicas:
        if r.state == FAILED:
            rnd.stops.append(_stop(r, "failed; stopped so its GPUs are freed"))
    live = [r for r in replicas if r.state in COUNTING_STATES]
    live_ids = {r.id for r in live}
    replacement: dict[str, ReplicaInfo] = {}
    for r in live:
        if r.replaces in live_ids and r.replaces not in replacement:
            replacement[r.replaces] = r
    moving = set(replacement) | {r.id for r in replacement.values()}
    for old in live:
        new = replacement.get(old.id)
        if new is not None and new.state == REPLICA_READY:
            rnd.stops.append(_stop(old, f"replaced by {new.id}, which is ready"))
    rnd.count = len(live) - len(replacement)
    singles = [r for r in live if r.id not in moving]
    rnd.target = desired(model)
    singles = _stop_above_max(rnd, singles, draining_node, now)
    singles = _stop_idle(rnd, singles, now)
    singles = _stop_above_scale(rnd, singles, now)
    for r in singles:
        node = draining_node(r)
        if node is None:
            continue
        if rnd.count > rnd.target:
            rnd.stops.append(_stop(r, f"on draining node {node}, and {model.name} has more replicas than it needs"))
            rnd.count -= 1
        else:
            rnd.moves.append((r, node))
    return rnd


def _stop(r: ReplicaInfo, reason: str) -> StopDecision:
    return StopDecision(replica_id=r.id, model=r.model, reason=reason)


def _stop_above_max(
    rnd: ModelRound, singles: list[ReplicaInfo], draining_node: Callable[[ReplicaInfo], str | None], now: datetime
) -> list[ReplicaInfo]:
    """Stop replicas above the maximum: those on draining nodes, then not yet serving, then least used."""
    limit = max(rnd.model.max_replicas, rnd.model.min_replicas)
    excess = rnd.count - limit
    if excess <= 0:
        return singles
    order = sorted(
        singles,
        key=lambda r: (draining_node(r) is None, _STOP_ORDER.get(r.state, 0), -idle_seconds(r, now), r.id),
    )
    stopping = {r.id for r in order[:excess]}
    for r in order[:excess]:
        rnd.stops.append(_stop(r, f"above the maximum of {limit} replicas"))
    rnd.count -= len(stopping)
    return [r for r in singles if r.id not in stopping]


def _stop_above_scale(rnd: ModelRound, singles: list[ReplicaInfo], now: datetime) -> list[ReplicaInfo]:
    """Stop one replica above the autoscaler's count: one not yet serving, else the least used (longest idle).

    One per round whatever the gap (the autoscaler steps down one at a time),
    and none in a round that stopped replicas for idleness already (that
    sets the target to the count left).
    """
    if rnd.model.scale_to is None or rnd.count <= rnd.target:
        return singles
    order = sorted(singles, key=lambda r: (_STOP_ORDER.get(r.state, 0), -idle_seconds(r, now), r.id))
    if not order:
        return singles
    chosen = order[0]
    rnd.stops.append(_stop(chosen, f"scaling down to {rnd.target}: {rnd.model.scale_reason}"))
    rnd.count -= 1
    return [r for r in singles if r.id != chosen.id]


def _stop_idle(rnd: ModelRound, singles: list[ReplicaInfo], now: datetime) -> list[ReplicaInfo]:
    """Stop ready replicas nobody used for the idle timeout, longest idle first, down to the minimum.

    Only ready replicas: one still fetching a hundred gigabytes has not had the
    chance to be used. When any is stopped the model is not topped up again
    this round, or demand and idleness would start and stop replicas in turn.
    """
    timeout = rnd.model.idle_timeout_s
    if timeout is None:
        return singles
    idle = [r for r in singles if r.state == REPLICA_READY and idle_seconds(r, now) >= timeout]
    idle.sort(key=lambda r: (-idle_seconds(r, now), r.id))
    floor = max(0, rnd.model.min_replicas)
    stopping: set[str] = set()
    for r in idle:
        if rnd.count <= floor:
            break
        rnd.stops.append(
            _stop(
                r,
                f"idle for {idle_seconds(r, now):.0f} s (timeout {timeout:.0f} s); "
                f"scaling down to the minimum of {floor}",
            )
        )
        stopping.add(r.id)
        rnd.count -= 1
    if stopping:
        rnd.target = rnd.count
    return [r for r in singles if r.id not in stopping]
