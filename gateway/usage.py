"""Usage: one record per request, the hourly roll-up, and budgets settled, written in batches.

Requests end on the event loop; their records are queued in memory and
written every LLMGW_GATEWAY_FLUSH_EVERY_S in one transaction (the records,
the roll-up and the budgets they settle), which costs a handful of
statements per batch instead of per request. PostgreSQL is the record:
nothing here goes through Redis. A batch the database refuses stays queued
and is tried again; the queue is flushed one last time when the process
exits.

Also here: handing placement the time each replica was last used, batched
(``placement.demand.touch``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from django.db import connection, transaction
from django.utils import timezone

from gateway import budgets, ratelimit
from gateway.keys import Caller
from gateway.models import UsageHour, UsageRecord

log = logging.getLogger("llmgw.gateway")
# Past this many unwritten records (the database has been away for a while)
# the oldest are dropped, with an error in the log, rather than the gateway
# running out of memory.
MAX_QUEUED = 200_000
PRUNE_EVERY_S = 60.0
CLIENT_CLOSED = 499


@dataclass
class Finished:
    """A request that got past the key check, as it ended."""

    at: datetime
    caller: Caller
    requested: str
    model: str
    replica_id: str
    endpoint: str
    stream: bool
    prompt_tokens: int
    completion_tokens: int
    counted_by: str
    cost_micros: int
    status: int
    outcome: str
    latency_ms: float
    ttfb_ms: float | None
    reserved: tuple[tuple[int, int], ...] = ()
    """(budget id, micros reserved) to take back."""

    @property
    def ok(self) -> bool:
        """Not an error: answered, or given up by the client (499), which is no fault of the service."""
        return self.status < 400 or self.status == CLIENT_CLOSED


def hour_of(at: datetime) -> datetime:
    return at.replace(minute=0, second=0, microsecond=0)


def _rollup_sql() -> str:
    t = connection.ops.quote_name(UsageHour._meta.db_table)
    return (
        f"INSERT INTO {t} (hour, key_id, model, requests, errors, prompt_tokens, completion_tokens, "
        f"cost_micros, last_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s) "
        f"ON CONFLICT (hour, key_id, model) DO UPDATE SET "
        f"requests = {t}.requests + excluded.requests, errors = {t}.errors + excluded.errors, "
        f"prompt_tokens = {t}.prompt_tokens + excluded.prompt_tokens, "
        f"completion_tokens = {t}.completion_tokens + excluded.completion_tokens, "
        f"cost_micros = {t}.cost_micros + excluded.cost_micros, "
        f"last_at = CASE WHEN excluded.last_at > {t}.last_at THEN excluded.last_at ELSE {t}.last_at END"
    )


# The record's columns, in the order _record_row gives their values.
RECORD_FIELDS = (
    "at",
    "key",
    "team",
    "org",
    "requested",
    "model",
    "replica_id",
    "endpoint",
    "stream",
    "prompt_tokens",
    "completion_tokens",
    "counted_by",
    "cost_micros",
    "status",
    "outcome",
    "latency_ms",
    "ttfb_ms",
)
# Records per INSERT: well under PostgreSQL's 65,535 and SQLite's 32,766 parameters.
ROWS_PER_INSERT = 500


def _insert_sql(rows: int) -> str:
    q = connection.ops.quote_name
    columns = ", ".join(q(UsageRecord._meta.get_field(name).column) for name in RECORD_FIELDS)
    one = "(" + ", ".join(["%s"] * len(RECORD_FIELDS)) + ")"
    return f"INSERT INTO {q(UsageRecord._meta.db_table)} ({columns}) VALUES " + ", ".join([one] * rows)


def _record_row(f: Finished) -> list:
    return [
        f.at,
        f.caller.key_id,
        f.caller.team_id,
        f.caller.org_id,
        f.requested,
        f.model,
        f.replica_id,
        f.endpoint,
        f.stream,
        f.prompt_tokens,
        f.completion_tokens,
        f.counted_by,
        f.cost_micros,
        f.status,
        f.outcome,
        round(f.latency_ms, 3),
        None if f.ttfb_ms is None else round(f.ttfb_ms, 3),
    ]


def statements(batch: list[Finished], now: datetime, *, records: bool = True) -> list[budgets.Statement]:
    """A batch's writes as SQL, to run in order in one transaction: records, roll-up, settlements.

    Plain SQL so that one description serves both writers: the ORM's
    connection on a thread (``write``), and on PostgreSQL the gateway's
    connections on the event loop (gateway.pgpath), where writing costs the
    request path no wait for the interpreter lock. ``records`` False leaves
    the records out, for a writer that copies them (``copy``).
    """
    out: list[budgets.Statement] = []
    for at in range(0, len(batch) if records else 0, ROWS_PER_INSERT):
        part = batch[at : at + ROWS_PER_INSERT]
        out.append((_insert_sql(len(part)), [value for f in part for value in _record_row(f)]))
    hours: dict[tuple, list] = {}
    for f in batch:
        row = hours.setdefault((hour_of(f.at), f.caller.key_id, f.model or f.requested), [0, 0, 0, 0, 0, f.at])
        row[0] += 1
        row[1] += 0 if f.ok else 1
        row[2] += f.prompt_tokens
        row[3] += f.completion_tokens
        row[4] += f.cost_micros
        row[5] = max(row[5], f.at)
    sql = _rollup_sql()
    # Sorted so that two writers touching the same hours lock them in one order.
    for (hour, key_id, model), row in sorted(hours.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2])):
        out.append((sql, [hour, key_id, model, *row]))
    return out + budgets.settle_statements(_charges(batch), now)


def copy(batch: list[Finished]) -> tuple[str, list[list]]:
    """The batch's records as PostgreSQL's COPY takes them: the statement and the rows.

    For the writer on the event loop: copying a thousand records cost the
    loop 7 ms of CPU where the INSERT's parameters cost 60 ms, time in which
    no request moved.
    """
    q = connection.ops.quote_name
    columns = ", ".join(q(UsageRecord._meta.get_field(name).column) for name in RECORD_FIELDS)
    return f"COPY {q(UsageRecord._meta.db_table)} ({columns}) FROM STDIN", [_record_row(f) for f in batch]


def write(batch: list[Finished], now: datetime | None = None) -> None:
    """Write a batch here, with the ORM's connection: records, roll-up and budget settlements, all or nothing."""
    if not batch:
        return
    with transaction.atomic(), connection.cursor() as cursor:
        for sql, params in statements(batch, now or timezone.now()):
            cursor.execute(sql, params)


def _charges(batch: Iterable[Finished]) -> Iterable[tuple[int, int, int]]:
    for f in batch:
        reserved = dict(f.reserved)
        for budget_id in f.caller.budget_ids:
            yield budget_id, reserved.get(budget_id, 0), f.cost_micros


def touch_replicas(times: dict[str, datetime]) -> None:
    """Tell placement when each replica was last used.

    Through ``placement.demand.touch`` when placement has it; until then the
    replica's ``last_used_at`` is written directly, which is what idle
    scale-down reads either way.
    """
    try:
        from placement.demand import touch
    except ImportError:
        from placement.models import Replica

        for replica_id, at in times.items():
            Replica.objects.filter(pk=replica_id).update(last_used_at=at)
        return
    for replica_id, at in times.items():
        touch(replica_id, at)


class Writer:
    """Queues finished requests and replica uses; writes them from background tasks.

    ``run_db`` runs a function on an ORM thread. ``write_batch``, when given,
    writes a batch instead of ``write`` on that thread (gateway.pgpath's, on
    the event loop). Once a minute it also deletes the rate-limit windows
    nothing reads any more.
    """

    def __init__(self, run_db, flush_every_s: float, touch_every_s: float, write_batch=None) -> None:
        self.run_db = run_db
        self.write_batch = write_batch
        self.flush_every_s = flush_every_s
        self.touch_every_s = touch_every_s
        self.queue: list[Finished] = []
        self.touched: dict[str, datetime] = {}
        self._lock = threading.Lock()
        self._tasks: list[asyncio.Task] = []

    def start(self) -> None:
        if not self._tasks:
            self._tasks = [
                asyncio.ensure_future(self._loop(self.flush, self.flush_every_s)),
                asyncio.ensure_future(self._loop(self.flush_touches, self.touch_every_s)),
                asyncio.ensure_future(self._loop(self.prune, PRUNE_EVERY_S)),
            ]

    def add(self, finished: Finished) -> None:
        with self._lock:
            self.queue.append(finished)
            if len(self.queue) > MAX_QUEUED:
                dropped = len(self.queue) - MAX_QUEUED
                del self.queue[:dropped]
                log.error("usage: the database has not taken records for a while; dropped the %d oldest", dropped)

    def touch(self, replica_id: str, at: datetime) -> None:
        self.touched[replica_id] = at

    def _take(self) -> list[Finished]:
        with self._lock:
            batch, self.queue = self.queue, []
        return batch

    def _put_back(self, batch: list[Finished]) -> None:
        with self._lock:
            self.queue[:0] = batch

    async def _loop(self, job, every: float) -> None:
        while True:
            await asyncio.sleep(every)
            try:
                await job()
            except Exception:
                log.exception("gateway: writing usage failed; will retry")

    async def flush(self) -> None:
        batch = self._take()
        if not batch:
            return
        try:
            if self.write_batch is not None:
                await self.write_batch(batch)
            else:
                await self.run_db(write, batch)
        except BaseException:
            self._put_back(batch)
            raise

    async def flush_touches(self) -> None:
        if self.touched:
            times, self.touched = self.touched, {}
            await self.run_db(touch_replicas, times)

    async def prune(self) -> None:
        await self.run_db(ratelimit.db_prune, time.time())

    def flush_now(self) -> None:
        """Write what is queued, from this thread (at exit, when the loop is gone)."""
        batch = self._take()
        with contextlib.suppress(Exception):
            write(batch)
        with contextlib.suppress(Exception):
            if self.touched:
                touch_replicas(self.touched)
