"""The reconciler: make the replicas match the catalog, given the fleet as it is now.

:func:`reconcile` is one pass, all in one transaction:

1. Replicas with a shard on a lost node are marked stopping: what was placed
   there counts as gone, and the plan below replaces them. Unreachable (not
   yet lost) nodes keep theirs. At most ``LLMGW_MOVES_PER_MINUTE`` are
   stopped in any minute, fleet-wide, oldest loss first
   (``placement.scheduling.failures``; the moves are rows,
   ``NodeLossMove``, so every control host counts the same); the others keep
   counting as their model's replicas until their turn, so nothing is placed
   for them yet. Nodes of a partition are never lost while it lasts
   (``inventory.reachability``), so nothing moves off them.
2. Stopping replicas are deleted once every node they ran on has sent a
   heartbeat since the stop that no longer lists them (or is lost): only
   then are their GPUs really free.
3. Replicas not ready past their start deadline are failed
   (``placement.writes.startdeadlines``: the deadline follows the model's
   size and the nodes' measured download rates), each a failed start; the
   plan below stops them and places others. Then models whose replicas
   failed at every start ``LLMGW_PARK_AFTER`` times in a row are parked
   with the last error, until an operator scales or unparks them.
4. Models with ``max > min`` get their desired count from the fleet's load
   (``placement.writes.autoscaling``: each decision recorded with its reason).
   A snapshot of the fleet, the catalog and the replicas is loaded and the
   pure scheduler makes a plan from it. With no model in the catalog there is
   nothing to plan, and this step and the next three are skipped.
5. The plan is applied: replicas to stop become ``stopping`` (their agents
   stop them at the next heartbeat); new replicas are created ``pending``
   with their shards; a replica on a draining node gets a replacement that
   records ``replaces`` while the old one keeps serving — a later pass stops
   it once the replacement is ready, so a drain leaves no gap.
6. Demand that got a replica is forgotten; demand older than its TTL too.
7. Each model's explanation (rejections, stale replicas) is written when it
   changed, so running twice in a row writes nothing the second time.

Safe to run twice: every step looks at what is, not at what happened.
Rows may be deleted under a pass (a model removed, a profile dropped, a node
forgotten): a replica, a shard or an explanation pointing at one is skipped
and named in ``vanished`` (``core.vanished``), the rest of the pass is
written, and the next pass plans from what is left.
Never run in parallel with itself: the Celery task holds a lock around it.
"""

from __future__ import annotations

import gc
import logging
import os
import threading
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from catalog.models import CatalogModel
from core import tracing
from core.models import AuditEntry
from core.vanished import keys_checked_at_once, unless_gone
from placement import outgoing
from placement import snapshot as snap
from placement.models import Demand, NodeLossMove, PlacementExplanation, Replica, ReplicaState, Shard
from placement.moves import moves_per_minute
from placement.scheduler import NewReplica, Plan, Planner
from placement.scheduling.failures import MINUTE, Waiting, admit
from placement.writes import autoscaling, startdeadlines

log = logging.getLogger(__name__)
ACTOR = "reconciler"

# One planner per process, kept from pass to pass: it patches what changed into the last pass's
# plan and plans in full when it cannot (placement.scheduler.Planner), and its plan is always the
# full plan's (tests/placement/test_planner_incremental.py). Passes never overlap (the task's lock);
# the lock here only keeps a second thread in the same process from sharing it mid-plan.
_PLANNER = Planner()
# Beside it, the snapshot's reader, which reads again only the rows that changed since the last pass
# (placement.snapshot.FleetReader; its snapshot is a new reader's, tests/placement/test_snapshot_kept.py).
_READER = snap.FleetReader()
_PLANNER_LOCK = threading.Lock()
# When this process last planned (time.monotonic()), None when it holds nothing to let go.
_last_planned: float | None = None
# A planner and reader not used for this long are let go (let_go_if_idle). Each worker process that has
# run a pass keeps its own (some 40 MB at 10,000 nodes, and the pages around them): where several workers
# share the passes (control hosts, or a worker run with Celery's forked pool), one that stopped getting
# them would otherwise hold them for good.
IDLE_S = 60.0
PARK_AFTER_DEFAULT = 3
# Moves older than this no longer count toward any rate and are deleted.
KEEP_MOVES = timedelta(hours=1)


def park_after() -> int:
    """How many failed starts in a row park a model (``LLMGW_PARK_AFTER``, default 3; at least 1)."""
    try:
        return max(1, int(os.environ.get("LLMGW_PARK_AFTER", PARK_AFTER_DEFAULT)))
    except ValueError:
        return PARK_AFTER_DEFAULT


@dataclass
class Result:
    """What one pass did, by replica id (or model name for ``parked``)."""

    created: list[str] = field(default_factory=list)
    replacing: list[str] = field(default_factory=list)
    stopped: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    reaped: list[str] = field(default_factory=list)
    parked: list[str] = field(default_factory=list)
    timed_out: list[str] = field(default_factory=list)
    """Replicas failed for not being ready by their start deadline."""
    stale: list[str] = field(default_factory=list)
    explained: list[str] = field(default_factory=list)
    scaled: list[str] = field(default_factory=list)
    """Models whose desired count the autoscaler changed."""
    # Replicas on lost nodes left for a later pass by the move rate (reported, not written).
    waiting: list[str] = field(default_factory=list)
    # Writes let go because a row they point at was deleted during the pass ("replica of m", "explanation of m").
    vanished: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        """Whether anything was written (stale replicas are only reported)."""
        written = (
            self.created,
            self.replacing,
            self.stopped,
            self.lost,
            self.reaped,
            self.timed_out,
            self.parked,
            self.explained,
        )
        return any(written) or bool(self.scaled)

    def summary(self) -> dict:
        return {k: len(v) for k, v in asdict(self).items()}


def reconcile(now: datetime | None = None) -> Result:
    """One reconciling pass (see the module docstring for its steps)."""
    now = now or timezone.now()
    result = Result()
    with tracing.span("placement.reconcile") as span:
        with transaction.atomic(), keys_checked_at_once():
            _stop_on_lost_nodes(now, result)
            _reap(result)
            result.timed_out = startdeadlines.fail_overdue(now)
            _park(now, result)
            # A catalog with no model has nothing to place, scale or explain (and, replicas going with their
            # model, nothing placed): the fleet's snapshot, a second's work at 10,000 nodes, is not read.
            if CatalogModel.objects.exists():
                _plan_and_write(now, result)
        span.set_attributes({f"llmgw.{k}": v for k, v in result.summary().items()})
    if result.changed:
        transaction.on_commit(lambda: _publish(result))
    return result


def _plan_and_write(now: datetime, result: Result) -> None:
    """Scale, plan against the fleet's snapshot, and write what the plan decided and explains."""
    with tracing.span("placement.reconcile.plan"):
        scaling = autoscaling.autoscale(now, result.vanished)
        result.scaled = scaling.changed
        global _last_planned
        with _PLANNER_LOCK:
            loaded = _READER.load(now, scaling.desired)
            decided = _PLANNER.plan(loaded.snapshot)
            _last_planned = time.monotonic()
    with tracing.span("placement.reconcile.writes"):
        _apply(decided, loaded, now, result)
        _forget_demand(now, result)
        _explain(decided, loaded, now, result)


def let_go_if_idle(now: float | None = None) -> bool:
    """Let go of this process's planner and snapshot reader when it has not planned for ``IDLE_S``; whether it did.

    ``now`` is ``time.monotonic()``'s. Its next pass, if one comes, reads and plans in full, as a first pass does
    (a second or two at 10,000 nodes); a planner idle that long would have most of the fleet to catch up on.
    """
    global _PLANNER, _READER, _last_planned
    now = time.monotonic() if now is None else now
    with _PLANNER_LOCK:
        if _last_planned is None or now - _last_planned < IDLE_S:
            return False
        _PLANNER, _READER, _last_planned = Planner(), snap.FleetReader(), None
    gc.collect()
    return True


# --- 1. lost nodes ---------------------------------------------------------------


def _stop_on_lost_nodes(now: datetime, result: Result) -> None:
    NodeLossMove.objects.filter(at__lt=now - KEEP_MOVES).delete()
    doomed = {
        r.id: r
        for r in Replica.objects.filter(shards__node__lost=True)
        .exclude(state=ReplicaState.STOPPING)
        .distinct()
        .select_related("model")
        .prefetch_related("shards__node")
    }
    if not doomed:
        return
    lost_nodes = {rid: [s.node for s in r.shards.all() if s.node.lost] for rid, r in doomed.items()}
    waiting = [Waiting(rid, min(_silent_since(n, now) for n in nodes)) for rid, nodes in lost_nodes.items()]
    recent = NodeLossMove.objects.filter(at__gt=now - MINUTE).values_list("at", flat=True)
    chosen = admit(waiting, list(recent), now, moves_per_minute())
    for rid in chosen:
        names = sorted({n.name for n in lost_nodes[rid]})
        _stop(doomed[rid], now, f"node {', '.join(names)} was lost; replaced elsewhere")
        NodeLossMove.objects.create(
            replica_id=rid, nodes=names, lost_at=min(_silent_since(n, now) for n in lost_nodes[rid]), at=now
        )
        result.lost.append(rid)
    result.waiting = sorted(set(doomed) - set(chosen))


def _silent_since(node, now: datetime) -> datetime:
    return node.unreachable_since or node.last_seen or now


def _stop(replica: Replica, now: datetime, reason: str) -> None:
    replica.state = ReplicaState.STOPPING
    replica.stopping_since = now
    replica.save(update_fields=["state", "stopping_since"])
    AuditEntry.record(ACTOR, "stop-replica", f"{replica.model.name}#{replica.id}", {"reason": reason})


# --- 2. reaping -------------------------------------------------------------------


def _reap(result: Result) -> None:
    stopping = list(Replica.objects.filter(state=ReplicaState.STOPPING).prefetch_related("shards__node").order_by("id"))
    gone = [r for r in stopping if all(_shard_gone(r, s) for s in r.shards.all())]
    if gone:
        Replica.objects.filter(id__in=[r.id for r in gone]).delete()
        result.reaped.extend(r.id for r in gone)


def _shard_gone(replica: Replica, shard: Shard) -> bool:
    """The node is lost, or has sent a heartbeat since the stop that no longer lists the shard."""
    node = shard.node
    if node.lost:
        return True
    if replica.stopping_since is None or node.last_seen is None or node.last_seen <= replica.stopping_since:
        return False
    listed = {e.get("id") for e in node.shard_status or [] if isinstance(e, dict)}
    listed |= {f"{e.get('replica')}-{e.get('rank', 0)}" for e in node.shard_status or [] if isinstance(e, dict)}
    return f"{replica.id}-{shard.rank}" not in listed


# --- 3. parking -------------------------------------------------------------------


def _park(now: datetime, result: Result) -> None:
    limit = park_after()
    for model in CatalogModel.objects.filter(parked_at__isnull=True, failure_streak__gte=limit):
        last = (
            Replica.objects.filter(model=model, state__in=[ReplicaState.FAILED, ReplicaState.STOPPING])
            .exclude(error="")
            .order_by("-created_at")
            .first()
        )
        model.parked_at = now
        model.parked_error = last.error if last else f"{model.failure_streak} starts failed in a row"
        model.save(update_fields=["parked_at", "parked_error", "updated_at"])
        detail = {"failed_starts": model.failure_streak, "error": model.parked_error}
        AuditEntry.record(ACTOR, "park", model.name, detail)
        result.parked.append(model.name)


# --- 5. applying the plan -------------------------------------------------------------


def _apply(decided: Plan, loaded: snap.Loaded, now: datetime, result: Result) -> None:
    stops = {s.replica_id: s.reason for s in decided.stop}
    for r in Replica.objects.filter(id__in=stops).exclude(state=ReplicaState.STOPPING).select_related("model"):
        _stop(r, now, stops[r.id])
        result.stopped.append(r.id)
    for new in decided.create:
        with unless_gone(f"replica of {new.model}", result.vanished):
            result.created.append(_create(new, loaded, now, replaces=None))
    for move in decided.replace:
        with unless_gone(f"replica of {move.new.model}", result.vanished):
            rid = _create(move.new, loaded, now, replaces=move.old_replica_id)
            AuditEntry.record(
                ACTOR, "replace-replica", f"{move.new.model}#{move.old_replica_id}", {"by": rid, "reason": move.reason}
            )
            result.replacing.append(rid)
    result.stale = list(decided.stale)


def _create(new: NewReplica, loaded: snap.Loaded, now: datetime, replaces: str | None) -> str:
    model_id = loaded.model_ids[new.model]
    source = CatalogModel.objects.filter(pk=model_id).values_list("source", flat=True).first() or ""
    replica = Replica.objects.create(
        model_id=model_id,
        profile_id=loaded.profile_ids.get((new.model, new.profile)),
        profile_name=new.profile,
        profile_fingerprint=new.fingerprint,
        pool=new.pool or "",
        fabric=new.fabric or "",
        nvlink_domain_id=loaded.domain_ids.get(new.nvlink_domain) if new.nvlink_domain else None,
        replaces_id=replaces,
        created_at=now,
    )
    Shard.objects.bulk_create(
        Shard(
            replica=replica,
            node_id=loaded.node_ids[s.node],
            rank=s.rank,
            gpu_indices=list(s.gpus),
            env=dict(s.env),
            fetch_source=source[:500],
        )
        for s in new.shards
    )
    return replica.id


# --- 6. demand --------------------------------------------------------------------------


def _forget_demand(now: datetime, result: Result) -> None:
    placed = Replica.objects.filter(id__in=result.created + result.replacing).values_list("model_id", flat=True)
    Demand.objects.filter(Q(model_id__in=set(placed)) | Q(requested_at__lt=now - snap.DEMAND_TTL)).delete()


# --- 7. explanations ----------------------------------------------------------------------


def _explain(decided: Plan, loaded: snap.Loaded, now: datetime, result: Result) -> None:
    stale_by_model: dict[str, list[dict]] = {}
    if decided.stale:
        for r in Replica.objects.filter(id__in=decided.stale).select_related("model", "profile"):
            stale_by_model.setdefault(r.model.name, []).append(
                {
                    "replica": r.id,
                    "profile": r.profile_name,
                    "placed_fingerprint": r.profile_fingerprint,
                    "current_fingerprint": r.profile.fingerprint if r.profile else "",
                }
            )
    current = {e.model_id: e for e in PlacementExplanation.objects.all()}
    for name, model_id in loaded.model_ids.items():
        rejections = [asdict(r) for r in decided.rejections.get(name, ())]
        placed = name not in decided.unplaceable and name not in decided.parked
        stale = sorted(stale_by_model.get(name, []), key=lambda s: s["replica"])
        old = current.get(model_id)
        if old is not None and (old.placed, old.rejections, old.stale) == (placed, rejections, stale):
            continue
        with unless_gone(f"explanation of {name}", result.vanished):
            PlacementExplanation.objects.update_or_create(
                model_id=model_id,
                defaults={"computed_at": now, "placed": placed, "rejections": rejections, "stale": stale},
            )
            result.explained.append(name)
        if stale and (old is None or old.stale != stale):
            log.warning(
                "%s: replicas %s were placed under an older profile definition", name, [s["replica"] for s in stale]
            )


def _publish(result: Result) -> None:
    """Tell the apps above (the live pages); a page that misses it catches up at its next load."""
    try:
        outgoing.placement_changed.send(sender=Replica, result=result)
    except Exception:
        log.exception("could not publish the placement update")
