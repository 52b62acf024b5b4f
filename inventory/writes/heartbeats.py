"""The heartbeat desk: where light heartbeats are taken in, cheaply enough for thousands of nodes.

A fleet of 2,000 nodes beating every 5 s is 400 requests a second, on a
control host that also serves pages and runs the reconciler. Spending three
queries on each (who is this, write it, what should it run) does not keep up,
so the desk:

- remembers which node a credential belongs to (checked again after
  ``CREDENTIAL_TTL_S``, and at once when a flush finds the credential gone, so
  a revoked credential stops working within a flush);
- buffers heartbeats and writes them in one batch per flush (every
  ``LLMGW_HEARTBEAT_FLUSH_S``, 1 s by default) — liveness is the only thing a
  light heartbeat carries, and a second of it is all a crash can lose; full
  reports, which carry what the machine *is*, are written at once;
- answers "what should I run" from a per-process copy of the shard table,
  refreshed with one query per flush.

A node that comes back after being marked unreachable is noticed at flush time
and announced to the live pages then.

This is the one way a heartbeat is taken, by production and the tests alike:
the fast lane (agentapi/fast.py) parses the HTTP and calls :func:`refusal`,
the desk's credential cache and :func:`take`; the flusher writes. What the
beats say about shards and collected weights, and what the answers hand out
of them, are placement's and the catalog's: the desk tells them through
inventory/signals.py and never imports them.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime

from django.db import close_old_connections, connection, transaction
from django.utils import timezone

from agent.protocol import report_digest
from core import jsontext, outage
from core.compiled import CompiledQuery
from core.credentials import hash_token
from core.errors import DATABASE_DOWN
from core.jsonrows import DecodedOnce, values_list_as_text
from inventory import signals
from inventory.bounds import report_bounds
from inventory.models import FabricScan, Node
from inventory.report_schema import heartbeat_problems, report_problems
from inventory.signals import HeartbeatTables, heartbeat_answers_wanted, heartbeats_flushed
from inventory.writes import node_locks

log = logging.getLogger(__name__)

# A flush notices a rotated or revoked credential at once (it compares digests), so the cache may
# keep a node for a while: this only bounds how long a deleted node's cached entry lingers.
CREDENTIAL_TTL_S = 300.0

LEARN_EVERY_S = 5.0
"""How often at most a credential the desk does not know makes it read the whole fleet's (``lookup``)."""

_FLEET_REFS = CompiledQuery(
    lambda: Node.objects.exclude(credential_digest="").values_list("pk", "name", "report_digest", "credential_digest")
)
# The lookup of one credential the desk did not know, compiled once (core.compiled). The digest is unique.
_NODE_REF = CompiledQuery(
    lambda digest: Node.objects.filter(credential_digest=digest).values_list("pk", "name", "report_digest")[:1]
)


def _batch_sql() -> str:
    """Every node's heartbeat of a batch at once: one ``UPDATE … FROM`` one JSON document.

    Each node is alive now, holds what its beat said (or what was there) and
    is reachable again. Plain SQL, not the ORM: bulk_update built a CASE
    expression per column and row, and for the 370 beats of a 2,000-node
    fleet's second that cost half a second of the interpreter, during which
    no heartbeat was answered. The credential's digest is checked again in
    the statement, so a credential revoked since it was read is not written.
    One statement instead of one per node, and one parameter: the batch as a
    JSON array with a row per node, ``[id, digest, last_seen, last_report_at,
    load, shard_status]``, encoded in C (:func:`_document`). Six arrays (one
    per column) cost psycopg a Python escape of every element: 130 ms of the
    interpreter for a flush of 2,000 beats (a 10,000-node fleet's second),
    during which no heartbeat was answered; the document costs a few. The
    statement's text is the same for every batch, so it is parsed once. A
    JSON null (a value the beat did not send) is SQL NULL, which keeps what
    was there.
    """
    q = connection.ops.quote_name
    c = {f.name: q(f.column) for f in Node._meta.concrete_fields}
    return (
        f"UPDATE {q(Node._meta.db_table)} AS n SET {c['last_seen']} = v.last_seen, "
        f"{c['last_report_at']} = COALESCE(v.last_report_at, n.{c['last_report_at']}), "
        f"{c['load']} = COALESCE(v.load, n.{c['load']}), "
        f"{c['shard_status']} = COALESCE(v.shard_status, n.{c['shard_status']}), "
        f"{c['reachable']} = true, {c['lost']} = false, {c['unreachable_since']} = NULL "
        "FROM (SELECT (r ->> 0)::bigint AS id, r ->> 1 AS digest, (r ->> 2)::timestamptz AS last_seen, "
        "(r ->> 3)::timestamptz AS last_report_at, NULLIF(r -> 4, 'null'::jsonb) AS load, "
        "NULLIF(r -> 5, 'null'::jsonb) AS shard_status FROM jsonb_array_elements(%s::jsonb) AS r) AS v "
        f"WHERE n.{c['id']} = v.id AND n.{c['credential_digest']} = v.digest"
    )


def write_beats(cursor, beats: list[tuple[int, str, Beat]]) -> None:
    """Write (node pk, credential digest, beat) rows in one statement."""
    rows = []
    for pk, digest, beat in beats:
        fields = beat.fields
        reported = fields.get("last_report_at")
        row = [pk, digest, beat.last_seen.isoformat(), None if reported is None else reported.isoformat()]
        rows.append([*row, fields.get("load"), fields.get("shard_status")])
    cursor.execute(_batch_sql(), [_document(rows)])


def _document(rows: list[list]) -> str:
    """A batch's rows as JSON text (core.jsontext: orjson, json for an int past 64 bits).

    PostgreSQL refuses an int past 64 bits as the column would. Each value is
    what the beat's checks let through (heartbeat_problems), so no NaN or
    infinity reaches here (orjson would write it as null, which keeps the
    column as it was).
    """
    return jsontext.compact(rows).decode()


@dataclass
class NodeRef:
    """A node as the desk knows it, under the credential digest it was found by."""

    pk: int
    name: str
    report_digest: str
    digest: str
    checked_at: float


@dataclass
class Beat:
    last_seen: datetime
    fields: dict


@dataclass
class FlushResult:
    written: int = 0
    came_back: list[tuple[int, str]] = field(default_factory=list)
    revoked: int = 0


class HeartbeatDesk:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.nodes: dict[str, NodeRef] = {}
        # node pk -> the digests it is cached under in ``nodes`` (more than one while an old
        # credential is still cached): a registration forgets the old ones without a scan of
        # ``nodes``, which a storm of 10,000 made 10,000 x 10,000 / 2 steps.
        self.digests: dict[int, set[str]] = {}
        self.pending: dict[int, tuple[str, Beat]] = {}
        self.shards: dict[int, list[dict]] = {}
        self.shards_loaded = False
        # when learn_fleet last read every node's credential, and whether a thread is reading them now
        self.learned_at = float("-inf")
        self.learning = False
        # node pk -> the topology scan assigned to it and not yet handed out (inventory/writes/scans.py)
        self.scans: dict[int, dict] = {}
        self.handed_out: list[int] = []
        # node name -> paths an operator asked to have deleted (see catalog.models.WeightCollection)
        self.collections: dict[str, list[str]] = {}
        self.collected: list[tuple[str, dict]] = []
        # node name -> weights to fetch before anything runs (see catalog.models.WeightPrefetch)
        self.prefetches: dict[str, list[dict]] = {}
        self.prefetched: list[tuple[str, dict]] = []

    # --- who is this ---

    def cached(self, secret: str) -> NodeRef | None:
        """The node for this credential if known and fresh; None means ask :meth:`lookup`."""
        ref = self.nodes.get(hash_token(secret))
        if ref is not None and time.monotonic() - ref.checked_at < CREDENTIAL_TTL_S:
            return ref
        return None

    def lookup(self, secret: str) -> NodeRef | None:
        """The node for this credential, from the database; None when unknown or revoked.

        A credential not known here is most often one of many: each of several
        admin processes meets the nodes the others registered, and a process
        that starts meets the whole fleet, within a heartbeat period. So the
        first miss in ``LEARN_EVERY_S`` reads every node's credential in one
        query (:meth:`learn_fleet`: 23 to 130 ms of CPU for 10,000 nodes,
        where 10,000 lookups one by one cost 1.4 s, measured in-process); a
        credential still not known is looked up alone, as one registered
        since or a wrong one is.
        """
        digest = hash_token(secret)
        if self._learning_due():
            self.learn_fleet()
            with self.lock:
                ref = self.nodes.get(digest)
            if ref is not None:
                return ref
        rows = _NODE_REF.rows(digest)
        row = rows[0] if rows else None
        with self.lock:
            if row is None:
                self._forget(digest)
                return None
            ref = NodeRef(row[0], row[1], row[2], digest, time.monotonic())
            self._cache(ref)
            return ref

    def _learning_due(self) -> bool:
        """True for one caller at a time once ``LEARN_EVERY_S`` has passed since the fleet was last read."""
        with self.lock:
            if self.learning or time.monotonic() - self.learned_at < LEARN_EVERY_S:
                return False
            self.learning = True
            return True

    def learn_fleet(self) -> None:
        """Know every node that has a credential, as the database holds them now (one query).

        What a view or lookup told the desk while the query ran is newer than
        the query's rows and is kept: a node it named is skipped. A credential
        known already is confirmed (its TTL starts again).
        """
        started = time.monotonic()
        try:
            rows = _FLEET_REFS.rows()
            with self.lock:
                for pk, name, report_digest, digest in rows:
                    held = self.digests.get(pk, ())
                    if any(self.nodes[d].checked_at >= started for d in held if d in self.nodes):
                        continue
                    self._cache(NodeRef(pk, name, report_digest, digest, started))
        finally:
            with self.lock:
                self.learned_at, self.learning = time.monotonic(), False

    def remember(self, node: Node) -> None:
        """A view that just read or wrote this node tells the desk what it now knows."""
        with self.lock:
            for digest in self.digests.pop(node.pk, set()) - {node.credential_digest}:
                if getattr(self.nodes.get(digest), "pk", None) == node.pk:
                    del self.nodes[digest]  # a rotated credential stops here at once
            if node.credential_digest:
                self._cache(NodeRef(node.pk, node.name, node.report_digest, node.credential_digest, time.monotonic()))

    def _cache(self, ref: NodeRef) -> None:
        """Know ``ref`` under its digest (the caller holds the lock)."""
        self._forget(ref.digest)  # the digest may have named another node before (a test's fixed digest)
        self.nodes[ref.digest] = ref
        self.digests.setdefault(ref.pk, set()).add(ref.digest)

    def _forget(self, digest: str) -> None:
        """Stop knowing the node cached under ``digest``, if any (the caller holds the lock)."""
        ref = self.nodes.pop(digest, None)
        if ref is None:
            return
        held = self.digests.get(ref.pk)
        if held is not None:
            held.discard(digest)
            if not held:
                del self.digests[ref.pk]

    # --- taking a beat ---

    def accept(self, ref: NodeRef, beat: dict, now: datetime) -> dict:
        """Queue a validated heartbeat; answer what the node should run and whether to send a report."""
        fields: dict = {}
        if "load" in beat:
            fields["load"] = beat["load"]
        if "shards" in beat:
            fields["shard_status"] = beat["shards"]
        with self.lock:
            self._queue(ref, now, fields)
            shards = self.shards.get(ref.pk, [])
            collect = self.collections.get(ref.name)
            prefetch = self.prefetches.get(ref.name)
            self.collected += [(ref.name, done) for done in beat.get("collected") or []]
            self.prefetched += [(ref.name, entry) for entry in beat.get("prefetch") or []]
        reported = beat.get("report_digest")
        send_report = not ref.report_digest or (reported is not None and reported != ref.report_digest)
        answer = {"shards": shards, "send_report": send_report}
        if collect:
            answer["collect"] = collect
        if prefetch:
            answer["prefetch"] = prefetch
        return answer

    def _queue(self, ref: NodeRef, now: datetime, fields: dict) -> None:
        """Queue a node's liveness; a later beat in the same second adds to what an earlier one said."""
        earlier = self.pending.get(ref.pk)
        merged = {**earlier[1].fields, **fields} if earlier else fields
        self.pending[ref.pk] = (ref.digest, Beat(now, merged))

    def accept_unchanged_report(self, ref: NodeRef, report: dict, now: datetime) -> dict:
        """A full report that says nothing new: taken like a heartbeat, answered like a report.

        Most full reports are this — the once-a-minute report of a machine that
        did not change — and the report's digest tells it without the database.
        """
        fields: dict = {"last_report_at": now}
        if "load" in report:
            fields["load"] = report["load"]
        with self.lock:
            self._queue(ref, now, fields)
            answer: dict = {"unchanged": True, "changed": False, "shards": self.shards.get(ref.pk, [])}
            scan = self.scans.pop(ref.pk, None)
            if scan is not None:
                self.handed_out.append(scan.pop("pk"))
                answer["scan"] = scan
        return answer

    def flush(self) -> FlushResult:
        """Write every queued heartbeat: one read and one batch of updates, however many there are.

        The batch's rows are locked in ascending id (inventory/writes/node_locks.py)
        before they are written, so the flush and the reachability sweep never
        cross; a batch chosen as a deadlock's victim anyway is written once more.
        When the database cannot be reached (a Patroni switchover or failover,
        a deadlock twice), the batch goes back in the queue for the next flush,
        under any newer beat of the same node: at most one entry per node is
        kept, and the nodes' last_seen lands when the database is back instead
        of every node looking silent for as long as the failover took. Any
        other failure drops the batch: one the database refused for what it
        holds would be refused again for ever, and hold up every beat after it.
        """
        with self.lock:
            pending, self.pending = self.pending, {}
        if not pending:
            return FlushResult()
        try:
            result, shard_reports = node_locks.once_more_on_deadlock(lambda: self._write(pending), "a heartbeat flush")
        except DATABASE_DOWN:
            self._requeue(pending)
            raise
        at = now_of(pending)
        self._mark_scans_pending(at)
        with self.lock:
            collected, self.collected = self.collected, []
            prefetched, self.prefetched = self.prefetched, []
        if shard_reports or result.came_back or collected or prefetched:
            # What the shards are doing moves Shard and Replica rows (placement's), and a reported
            # deletion settles a WeightCollection row (the catalog's): they follow this signal.
            heartbeats_flushed.send(
                sender=HeartbeatDesk,
                shard_reports=shard_reports,
                came_back=result.came_back,
                collected=collected,
                prefetched=prefetched,
                at=at,
            )
        return result

    def _write(self, pending: dict[int, tuple[str, Beat]]) -> tuple[FlushResult, list[tuple[int, str, list]]]:
        """One transaction: lock the batch's nodes in id order, read them under the lock, write each beat."""
        result = FlushResult()
        shard_reports: list[tuple[int, str, list]] = []
        rows = []
        with transaction.atomic():
            # What the shards were doing, as text decoded once per distinct text: most nodes of a fleet
            # say the same (nothing, most often), and decoding it node by node was a tenth of a flush.
            decoded = DecodedOnce()
            known = {
                pk: (name, digest, reachable, lost, decoded(shard_status))
                for pk, name, digest, reachable, lost, shard_status in values_list_as_text(
                    node_locks.locked(Node.objects.filter(pk__in=pending)),
                    ("pk", "name", "credential_digest", "reachable", "lost", "shard_status"),
                    ("shard_status",),
                )
            }
            for pk, (digest, beat) in sorted(pending.items()):
                node = known.get(pk)
                if node is None or node[1] != digest:
                    result.revoked += 1
                    with self.lock:
                        self._forget(digest)
                    continue
                name, _, reachable, lost, shard_status = node
                if not reachable or lost:
                    result.came_back.append((pk, name))
                reported = beat.fields.get("shard_status")
                if reported and reported != shard_status:
                    shard_reports.append((pk, name, reported))
                rows.append((pk, digest, beat))
            if rows:
                # One transaction: one commit for the batch, not one per node.
                with connection.cursor() as cursor:
                    write_beats(cursor, rows)
        result.written = len(rows)
        return result, shard_reports

    def _requeue(self, pending: dict[int, tuple[str, Beat]]) -> None:
        """Put a batch that could not be written back in the queue, under anything newer from the same node."""
        with self.lock:
            for pk, (digest, beat) in pending.items():
                newer = self.pending.get(pk)
                if newer is None:
                    self.pending[pk] = (digest, beat)
                else:
                    self.pending[pk] = (newer[0], Beat(newer[1].last_seen, {**beat.fields, **newer[1].fields}))

    def _mark_scans_pending(self, at: datetime | None) -> None:
        with self.lock:
            handed, self.handed_out = self.handed_out, []
        if handed:
            FabricScan.objects.filter(pk__in=handed, pending_since__isnull=True).update(
                pending_since=at or timezone.now()
            )

    # --- what to run ---

    def refresh_shards(self) -> None:
        """Reload what the answers hand out: the higher apps' tables, and the scans assigned to nodes."""
        tables = answer_tables()
        scans = {
            s.node_id: {"fabric": s.fabric_key, "hca": s.hca, "port": s.port, "pk": s.pk}
            for s in FabricScan.objects.filter(
                assigned_at__isnull=False, pending_since__isnull=True, node__isnull=False
            )
        }
        with self.lock:
            self.shards = tables.shards
            self.scans = {pk: scan for pk, scan in scans.items() if scan["pk"] not in self.handed_out}
            self.collections = tables.collect
            self.prefetches = tables.prefetch

            self.shards_loaded = True


def answer_tables() -> HeartbeatTables:
    """What every higher app wants handed out in heartbeat answers (``heartbeat_answers_wanted``), merged."""
    shards: dict[int, list[dict]] = {}
    collect: dict[str, list[str]] = {}
    prefetch: dict[str, list[dict]] = {}
    for _receiver, part in heartbeat_answers_wanted.send(sender=HeartbeatDesk):
        shards.update(part.shards)
        collect.update(part.collect)
        prefetch.update(part.prefetch)
    return HeartbeatTables(shards=shards, collect=collect, prefetch=prefetch)


desk = HeartbeatDesk()


def refusal(beat) -> str | None:
    """Why this heartbeat cannot be taken, in the words the agent is answered (a 400); None when it can."""
    problems = heartbeat_problems(beat)
    return "the heartbeat was not stored: " + "; ".join(problems) if problems else None


def take(ref: NodeRef, beat: dict) -> dict:
    """Queue a valid heartbeat from a known node, for the next flush to write; the answer to send back."""
    ensure_flusher()
    return desk.accept(ref, beat, now())


def take_unchanged_report(ref: NodeRef, report) -> dict | None:
    """Queue a full report that says nothing new like a heartbeat, and answer it; None when it says something.

    Only the common case is taken: a valid report whose digest matches the one
    stored for the node. A changed report, a refused one, anything in doubt is
    None, and the report view takes it (and answers as it always does).
    """
    if not ref.report_digest or not isinstance(report, dict):
        return None
    if report_problems(report, report_bounds()) or report_digest(report) != ref.report_digest:
        return None
    ensure_flusher()
    return desk.accept_unchanged_report(ref, report, now())


def flush_interval_s() -> float:
    return float(os.environ.get("LLMGW_HEARTBEAT_FLUSH_S", "1.0"))


class Flusher(threading.Thread):
    """Writes the desk's queue and refreshes its shard table, once per interval, in this process."""

    def __init__(self, target: HeartbeatDesk, interval_s: float) -> None:
        super().__init__(name="heartbeat-flusher", daemon=True)
        self.target = target
        self.interval_s = interval_s
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.wait(self.interval_s):
            self.once()
        self.once()

    def once(self) -> None:
        close_old_connections()
        try:
            result = self.target.flush()
            self.target.refresh_shards()
        except DATABASE_DOWN as exc:
            # Said once until it is back (core.outage); the beats are kept for the next flush.
            outage.database.failed(exc)
            return
        except Exception:
            log.exception("heartbeat flush failed; those heartbeats are lost, the next ones will do")
            return
        finally:
            close_old_connections()
        outage.database.back()
        signals.nodes_came_back.send(sender=Node, nodes=result.came_back)


_flusher: Flusher | None = None
_flusher_lock = threading.Lock()


def ensure_flusher() -> None:
    """Start this process's flusher on first use (tests flush by hand: LLMGW_HEARTBEAT_FLUSHER=manual)."""
    global _flusher
    running = _flusher
    # Asked once a beat: the running flusher is the common answer, and reading the environment
    # (a missed key raises inside os.environ) cost a tenth of a beat's CPU (bench/scale.py at 10k).
    if running is not None and running.is_alive():
        return
    if os.environ.get("LLMGW_HEARTBEAT_FLUSHER") == "manual":
        return
    with _flusher_lock:
        if _flusher is None or not _flusher.is_alive():
            _flusher = Flusher(desk, flush_interval_s())
            _flusher.start()


def stop_flusher(timeout_s: float = 10.0) -> None:
    """Stop this process's flusher after one last flush, so the beats queued before a stop are written.

    A server calls it once it has stopped taking requests (llmgw.serve, after
    uvicorn returns from SIGTERM): the flusher thread is a daemon, and without
    this the last second of heartbeats would end with the process.
    """
    global _flusher
    with _flusher_lock:
        flusher, _flusher = _flusher, None
    if flusher is not None and flusher.is_alive():
        flusher.stopping.set()
        flusher.join(timeout_s)


def now() -> datetime:
    return timezone.now()


def now_of(pending: dict) -> datetime | None:
    """The time of the latest beat in a flushed batch."""
    return max((beat.last_seen for _, beat in pending.values()), default=None)
