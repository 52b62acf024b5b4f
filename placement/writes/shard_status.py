"""What an agent says its shards are doing, turned into Shard and Replica rows.

Called with each heartbeat (and each full report) that carries ``shards``.
The agent's word is taken for its own shards only: an entry naming a replica
with no shard on this node is ignored. A shard the agent does not mention is
left as it was — it may not have picked it up yet.

A replica's state follows its shards: any failed → failed; all ready →
ready, with rank 0's endpoint; any fetching, starting or ready → starting;
otherwise pending. A replica already stopping is left alone.

The endpoint is where the gateway sends clients' requests, so it is taken
only from the node that runs rank 0 of that replica, and only when it points
at that node's own address (the ``address`` its agent reports, else its
hostname) over http(s) with a valid port. Anything else — another node's
word, a URL elsewhere — is logged and not stored: a node could otherwise
steer a replica's traffic, or the gateway's requests, anywhere.

Each shard's start phases (``phases``: fetch_s, load_s, weights_local, see
agent/supervisor/supervisor.py) are kept on the shard while it starts, and
once it is reported ready they are written as a ColdStart row — once per
shard — from which the next start's estimate is made
(placement.scheduling.coldstart). The heartbeat's schema has already refused
absurd timings (inventory.report_schema); what is kept here is only those keys.

A replica that fails before it was ever ready adds one to its model's
``failure_streak``; one that becomes ready resets it. The reconciler parks a
model whose streak reaches ``LLMGW_PARK_AFTER``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from agent.protocol import MAX_PHASE_S, PHASE_SECONDS
from catalog.models import CatalogModel
from inventory.models import Node
from placement import signals
from placement.models import ColdStart, Replica, ReplicaState, Shard, ShardState

# What an agent may report, and what it means for the shard row.
REPORTED_STATES = {s.value for s in ShardState} - {ShardState.PENDING}
LOG_LINES_IN_ERROR = 20
# Counts of bytes land in BigIntegerField columns; a larger number is not a count.
MAX_BYTES = 2**63 - 1
ENDPOINT_MAX = Replica._meta.get_field("endpoint").max_length
# More adapters than any engine holds at once (vLLM's --max-loras is a handful): the rest of a list is not kept.
ADAPTERS_MAX = 64
ADAPTER_NAME_MAX = 128

log = logging.getLogger(__name__)


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
        # ASCII digits only, and few: int() refuses "²" and a number of 5,000 digits.
        if not (rank_text.isascii() and rank_text.isdigit() and len(rank_text) <= 5):
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


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_BYTES


def node_hosts(node: Node) -> set[str]:
    """The hosts a node's engines may answer on: the address its agent reports, else its hostname."""
    return {h.lower() for h in ([node.mgmt_addr] if node.mgmt_addr else [node.hostname]) if h}


def endpoint_problem(endpoint: object, hosts: set[str]) -> str | None:
    """Why ``endpoint`` is not a URL of one of ``hosts`` the gateway may send requests to; None when it is."""
    if not isinstance(endpoint, str) or len(endpoint) > ENDPOINT_MAX:
        return f"the endpoint must be a URL of at most {ENDPOINT_MAX} characters"
    try:
        url = urlsplit(endpoint)
        port = url.port
    except ValueError:
        return f"{endpoint!r} is not a URL with a valid port"
    if url.scheme not in ("http", "https") or port is None or port == 0:
        return f"{endpoint!r} is not http(s)://<host>:<port>"
    if url.username is not None or url.password is not None or url.query or url.fragment or url.path not in ("", "/"):
        return f"{endpoint!r} must be just scheme, host and port"
    if (url.hostname or "") not in hosts:
        return f"{endpoint!r} is not at this node's address ({', '.join(sorted(hosts)) or 'none reported'})"
    return None


def _checked_endpoint(endpoint: object, node: Node, replica_id: str) -> str | None:
    problem = endpoint_problem(endpoint, node_hosts(node))
    if problem:
        log.warning("node %s: rank 0 of replica %s: endpoint ignored: %s", node.name, replica_id, problem)
        return None
    return str(endpoint)


def phases_of(entry: dict) -> dict:
    """The start phases of a shard's entry that may be kept: seconds in range, weights_local a bool."""
    phases = entry.get("phases")
    if not isinstance(phases, dict):
        return {}
    out: dict = {}
    for name in PHASE_SECONDS:
        value = phases.get(name)
        if isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value <= MAX_PHASE_S:
            out[name] = float(value)
    if isinstance(phases.get("weights_local"), bool):
        out["weights_local"] = phases["weights_local"]
    return out


def _fetched_bytes(shard: Shard, entry: dict) -> int | None:
    """The bytes the shard's fetch brought, by its ready report or its last one before; None: never said.

    A node's download rate is measured from these (placement/writes/startdeadlines.py).
    """
    fetch = entry.get("fetch")
    done = fetch.get("bytes_done") if isinstance(fetch, dict) else None
    done = done if _count(done) else shard.fetch_done
    return done or None


def _record_start(shard: Shard, phases: dict, fetch_bytes: int | None = None) -> None:
    """The shard's start, measured: one row per shard, and only the newest ``ColdStart.KEEP`` per node."""
    if "fetch_s" not in phases or "load_s" not in phases:
        return  # an older agent, or one that does not time its starts
    replica = shard.replica
    row = {"model_id": replica.model_id, "profile_name": replica.profile_name, "node": shard.node.name}
    ColdStart.objects.bulk_create(
        [
            ColdStart(
                **row,
                replica_id=replica.pk,
                rank=shard.rank,
                fetch_s=phases["fetch_s"],
                load_s=phases["load_s"],
                weights_local=bool(phases.get("weights_local", False)),
                fetch_bytes=fetch_bytes,
            )
        ],
        ignore_conflicts=True,
    )
    old = ColdStart.objects.filter(**row).order_by("-at", "-id").values_list("pk", flat=True)[ColdStart.KEEP :]
    ColdStart.objects.filter(pk__in=list(old)).delete()


def reported_adapters(entry: dict) -> list[str] | None:
    """The adapter names rank 0's engine has loaded, sorted; None when the entry does not say.

    Only names are kept, each a short printable word: the gateway sends one
    as the upstream request's ``model`` and prefers the replicas listing it,
    and an unknown name only makes a replica preferred for a model nobody
    asks for.
    """
    names = entry.get("adapters")
    if not isinstance(names, list):
        return None
    kept = {n for n in names if isinstance(n, str) and 0 < len(n) <= ADAPTER_NAME_MAX and n.isprintable()}
    return sorted(kept)[:ADAPTERS_MAX]


def _update_shard(shard: Shard, entry: dict) -> bool:
    fields: dict = {}
    state = entry.get("state")
    if isinstance(state, str) and state in REPORTED_STATES and state != shard.state:
        fields["state"] = state
    phases = phases_of(entry)
    if phases and phases != shard.phases:
        fields["phases"] = phases
    if fields.get("state") == ShardState.READY:
        _record_start(shard, phases, _fetched_bytes(shard, entry))
    error = shard_error(entry) if state == ShardState.FAILED else ""
    if error != shard.error:
        fields["error"] = error
    fetch = entry.get("fetch")
    if isinstance(fetch, dict):
        done, total = fetch.get("bytes_done"), fetch.get("bytes_total")
        source = str(fetch.get("source") or shard.fetch_source)[:500]
        values = {
            "fetch_source": source,
            "fetch_done": done if _count(done) else None,
            "fetch_total": total if _count(total) else None,
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
    shards = Shard.objects.filter(node_id=node_id, replica_id__in={r for r, _ in by_key}).select_related(
        "replica", "node"
    )
    touched: set[str] = set()
    # Only a shard of this node is ever matched, so only rank 0's own node can name an endpoint.
    endpoints: dict[str, str] = {}
    adapters: dict[str, list[str]] = {}
    for shard in shards:
        entry = by_key.get((shard.replica_id, shard.rank))
        if entry is None or shard.replica.state == ReplicaState.STOPPING:
            continue
        if _update_shard(shard, entry):
            touched.add(shard.replica_id)
        if shard.rank == 0 and entry.get("endpoint"):
            endpoint = _checked_endpoint(entry["endpoint"], shard.node, shard.replica_id)
            if endpoint:
                endpoints[shard.replica_id] = endpoint
                touched.add(shard.replica_id)
        loaded = reported_adapters(entry) if shard.rank == 0 else None
        if loaded is not None and loaded != shard.replica.adapters:
            # Rank 0 serves the API, so its node alone says what the engine has loaded.
            adapters[shard.replica_id] = loaded
    for replica_id, loaded in adapters.items():
        Replica.objects.filter(id=replica_id).exclude(state=ReplicaState.STOPPING).update(adapters=loaded)
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
            return _checked_endpoint(entry["endpoint"], first.node, replica.id)
    return None


def _follow_shards(replica: Replica, endpoint: str | None, result: Applied) -> None:
    shards = list(replica.shards.select_related("node"))
    new = replica_state(shards)
    fields: dict = {}
    if new != replica.state:
        fields["state"] = new
    if new == ReplicaState.READY:
        if replica.ready_at is None:
            fields["ready_at"] = timezone.now()
        endpoint = endpoint or _rank0_endpoint(replica, shards)
        if endpoint and endpoint != replica.endpoint:
            fields["endpoint"] = endpoint
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
    """Once per heartbeat flush (through :func:`follow_flush`): shard lists that changed, and nodes that came back.

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


def follow_flush(
    sender, *, shard_reports: list[tuple[int, str, list]], came_back: list[tuple[int, str]], **kwargs
) -> None:
    """``heartbeats_flushed`` (inventory/signals.py): :func:`follow` what the flush took, when it took any of it."""
    if shard_reports or came_back:
        follow(shard_reports, came_back)
