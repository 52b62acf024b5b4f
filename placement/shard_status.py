"""What an agent says its shards are doing, turned into Shard and Replica rows.

Called with each heartbeat (and each full report) that carries ``shards``.
The agent's word is taken for its own shards only: an entry naming a replica
with no shard on this node is ignored. A shard the agent does not mention is
left as it was — it may not have picked it up yet.

A replica's state follows its shards: any failed → failed; all ready →
ready, with rank 0's endpoint; any fetching, starting or ready → starting;
otherwise pending. A replica already stopping is left alone.

A replica that fails before it was ever ready adds one to its model's
``failure_streak``; one that becomes ready resets it. The reconciler parks a
model whose streak reaches ``LLMGW_PARK_AFTER``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from django.db import transaction
from django.db.models import F

from catalog.models import CatalogModel
from placement import signals
from placement.models import Replica, ReplicaState, Shard, ShardState

# What an agent may report, and what it means for the shard row.
REPORTED_STATES = {s.value for s in ShardState} - {ShardState.PENDING}
LOG_LINES_IN_ERROR = 20


@dataclass
class Applied:
    """What one report changed: replicas that became ready or failed (ids)."""

    ready: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    replacing: list[str] = field(default_factory=list)

    @property
    def wants_reconcile(self) -> bool:
        """A failure frees GPUs and may need a new replica; a ready replacement lets a drained one stop."""
        return bool(self.failed or self.replacing)


def _entry_key(entry: dict) -> tuple[str, int] | None:
    replica, rank = entry.get("replica"), entry.get("rank", 0)
    if not isinstance(replica, str) or not isinstance(rank, int):
        ident = entry.get("id")
        if not isinstance(ident, str) or "-" not in ident:
            return None
        replica, _, rank_text = ident.rpartition("-")
        if not rank_text.isdigit():
            return None
        rank = int(rank_text)
    return replica, rank


def shard_error(entry: dict) -> str:
    """The agent's error, with the end of the engine's log when it sent one: that is where the reason usually is."""
    error = str(entry.get("error") or "")
    tail = entry.get("log_tail")
    if isinstance(tail, list) and tail:
        lines = "\n".join(str(line) for line in tail[-LOG_LINES_IN_ERROR:])
        error = f"{error}\n{lines}" if error else lines
    return error[:8000]


def _update_shard(shard: Shard, entry: dict) -> bool:
    fields: dict = {}
    state = entry.get("state")
    if state in REPORTED_STATES and state != shard.state:
        fields["state"] = state
    error = shard_error(entry) if state == ShardState.FAILED else ""
    if error != shard.error:
        fields["error"] = error
    fetch = entry.get("fetch")
    if isinstance(fetch, dict):
        done, total = fetch.get("bytes_done"), fetch.get("bytes_total")
        source = str(fetch.get("source") or shard.fetch_source)[:500]
        values = {
            "fetch_source": source,
            "fetch_done": done if isinstance(done, int) and done >= 0 else None,
            "fetch_total": total if isinstance(total, int) and total >= 0 else None,
        }
        fields.update({k: v for k, v in values.items() if getattr(shard, k) != v})
    if not fields:
        return False
    for k, v in fields.items():
        setattr(shard, k, v)
    shard.save(update_fields=list(fields))
    return True


def replica_state(shards: list[Shard]) -> str:
    states = [s.state for s in shards]
    if ShardState.FAILED in states:
        return ReplicaState.FAILED
    if states and all(s == ShardState.READY for s in states):
        return ReplicaState.READY
    if any(s in (ShardState.FETCHING, ShardState.STARTING, ShardState.READY) for s in states):
        return ReplicaState.STARTING
    return ReplicaState.PENDING


def apply(node_id: int, entries: list[dict]) -> Applied:
    """Store what the agent on ``node_id`` reported; call inside the heartbeat's transaction."""
    result = Applied()
    by_key = {k: e for e in entries if isinstance(e, dict) and (k := _entry_key(e)) is not None}
    if not by_key:
        return result
    shards = Shard.objects.filter(node_id=node_id, replica_id__in={r for r, _ in by_key}).select_related("replica")
    touched: set[str] = set()
    for shard in shards:
        entry = by_key.get((shard.replica_id, shard.rank))
        if entry is None or shard.replica.state == ReplicaState.STOPPING:
            continue
        if _update_shard(shard, entry) or (entry.get("endpoint") and shard.rank == 0):
            touched.add(shard.replica_id)
    endpoints = {r: e.get("endpoint") for (r, rank), e in by_key.items() if rank == 0 and e.get("endpoint")}
    for replica in Replica.objects.filter(id__in=touched).exclude(state=ReplicaState.STOPPING):
        _follow_shards(replica, endpoints.get(replica.id), result)
    return result


def _rank0_endpoint(replica: Replica, shards: list[Shard]) -> str | None:
    """Rank 0's endpoint as its own node last reported it.

    The last shard of a multi-node replica to become ready is often not rank 0,
    whose node said where it answers in an earlier heartbeat.
    """
    first = next((s for s in shards if s.rank == 0), None)
    if first is None:
        return None
    for entry in first.node.shard_status or []:
        if isinstance(entry, dict) and _entry_key(entry) == (replica.id, 0) and entry.get("endpoint"):
            return str(entry["endpoint"])
    return None


def _follow_shards(replica: Replica, endpoint: str | None, result: Applied) -> None:
    shards = list(replica.shards.select_related("node"))
    new = replica_state(shards)
    fields: dict = {}
    if new != replica.state:
        fields["state"] = new
    if new == ReplicaState.READY:
        endpoint = endpoint or _rank0_endpoint(replica, shards)
        if endpoint and endpoint != replica.endpoint:
            fields["endpoint"] = str(endpoint)[:300]
    if new == ReplicaState.FAILED:
        error = next((f"{s.node.name}: {s.error}" for s in shards if s.state == ShardState.FAILED), "")
        if error != replica.error:
            fields["error"] = error
    if not fields:
        return
    before = replica.state
    for k, v in fields.items():
        setattr(replica, k, v)
    replica.save(update_fields=list(fields))
    if new == before:
        return
    if new == ReplicaState.READY:
        CatalogModel.objects.filter(pk=replica.model_id).exclude(failure_streak=0).update(failure_streak=0)
        result.ready.append(replica.id)
        if replica.replaces_id:
            result.replacing.append(replica.id)
    elif new == ReplicaState.FAILED:
        if before in (ReplicaState.PENDING, ReplicaState.STARTING):
            # Failed before it ever served: one more failed start in a row.
            CatalogModel.objects.filter(pk=replica.model_id).update(failure_streak=F("failure_streak") + 1)
        result.failed.append(replica.id)


def follow(reports: list[tuple[int, str, list]], came_back: list[tuple[int, str]] = ()) -> None:
    """The heartbeat desk's hook, once per flush: shard lists that changed, and nodes that came back.

    Each node's shards are applied in a transaction of their own, so one odd
    report cannot hold back the others; a failure, a ready replacement or a
    node back in the fleet asks for a reconcile soon.
    """
    for pk, name, entries in reports:
        with transaction.atomic():
            applied = apply(pk, entries)
        if applied.wants_reconcile:
            signals.shards_changed(name)
    for _pk, name in came_back:
        signals.node_state_changed(name)
