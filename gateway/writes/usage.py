"""Usage: one record per request, the hourly roll-up, and budgets settled, written in batches.

Requests end on the event loop; their records are queued in memory and
written every LLMGW_GATEWAY_FLUSH_EVERY_S in one transaction (the records,
the roll-up and the budgets they settle), which costs a handful of
statements per batch instead of per request. PostgreSQL is the record:
nothing here goes through Redis.

What an engine reports is checked before it is recorded (``engine_count``):
a count that is not a whole number a record can hold is not taken, and
llmgw counts instead. A batch the database refuses for what it holds (a
value out of range, a key deleted meanwhile) is split in halves and written
again, down to single records; a record refused on its own is set aside
(``SetAsideUsage``, logged once, counted in ``/metrics``) with its
reservation given back, and every other record is written. A batch that
fails for any other reason (the database is away) stays queued and is
tried again. Closing the writer waits for a write in progress, then writes
what is queued; what is still queued when the process exits is written
then.

Also here: handing placement the time each replica was last used, batched
(``placement.writes.demand.touch``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import math
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

import psycopg
from django import db
from django.db import connection, transaction
from django.utils import timezone

from gateway import ratelimit
from gateway.models import SetAsideUsage, UsageHour, UsageRecord
from gateway.rules import Caller
from gateway.writes import budgets, leases
from placement.writes import demand

log = logging.getLogger("llmgw.gateway")
# Past this many unwritten records (the database has been away for a while)
# the oldest are dropped, with an error in the log, rather than the gateway
# running out of memory.
MAX_QUEUED = 200_000
PRUNE_EVERY_S = 60.0
CLIENT_CLOSED = 499
# The most tokens a record holds: its PositiveIntegerField's bound on PostgreSQL
# (tests/gateway/test_usage_writer.py checks the two agree).
MAX_TOKENS = 2**31 - 1
# The most a record costs: a BigIntegerField's bound.
MAX_COST = 2**63 - 1
# Errors the database gives for what a batch holds, rather than for being away:
# such a batch is split until the record it refuses is found and set aside.
REFUSALS = (db.DataError, db.IntegrityError, psycopg.DataError, psycopg.IntegrityError)


def engine_count(value: object) -> int | None:
    """A token count as an engine reported it, as a number a record can hold; None when it is not one.

    The one check for every count that comes from outside llmgw (an
    answer's ``usage``, llama.cpp's ``timings``, ``/tokenize``): a bool, a
    fraction, NaN, a negative or a count past MAX_TOKENS is not a count, and
    the caller counts by itself instead of storing what no column can hold
    or charging a client for a number an engine made up.
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, float):
        if not math.isfinite(value) or not value.is_integer():
            return None
        value = int(value)
    if not isinstance(value, int) or not 0 <= value <= MAX_TOKENS:
        return None
    return value


def engine_usage(usage: object) -> tuple[int, int] | None:
    """(prompt, completion) an engine reported, when both are counts (``engine_count``); None otherwise."""
    if not isinstance(usage, tuple | list) or len(usage) != 2:
        return None
    prompt, completion = engine_count(usage[0]), engine_count(usage[1])
    return None if prompt is None or completion is None else (prompt, completion)


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
    clamped: bool = False
    """The engine reported more than the request allowed; the tokens are the bounds (gateway.tokens.within)."""

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
        f"cost_micros, clamped, last_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s) "
        f"ON CONFLICT (hour, key_id, model) DO UPDATE SET "
        f"requests = {t}.requests + excluded.requests, errors = {t}.errors + excluded.errors, "
        f"prompt_tokens = {t}.prompt_tokens + excluded.prompt_tokens, "
        f"completion_tokens = {t}.completion_tokens + excluded.completion_tokens, "
        f"cost_micros = {t}.cost_micros + excluded.cost_micros, "
        f"clamped = {t}.clamped + excluded.clamped, "
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
    "clamped",
)
# Records per INSERT: well under PostgreSQL's 65,535 parameters.
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
        f.clamped,
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
        row = hours.setdefault((hour_of(f.at), f.caller.key_id, f.model or f.requested), [0, 0, 0, 0, 0, 0, f.at])
        row[0] += 1
        row[1] += 0 if f.ok else 1
        row[2] += f.prompt_tokens
        row[3] += f.completion_tokens
        row[4] += f.cost_micros
        row[5] += f.clamped
        row[6] = max(row[6], f.at)
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
    """Tell placement when each replica was last used (``placement.writes.demand.touch``; idle scale-down reads it)."""
    for replica_id, at in times.items():
        demand.touch(replica_id, at)


def _as_text(f: Finished) -> str:
    """The record as JSON text that any text column can store (NULs and all escaped)."""
    return json.dumps(dataclasses.asdict(f), default=str, ensure_ascii=True)


def set_aside(f: Finished, reason: str, now: datetime | None = None) -> None:
    """Keep a record the database refused, and give its reservation back.

    Its cost is charged where the budgets can hold it; where even that is
    refused, the reservation is given back with nothing charged (the record
    kept here says what it cost).
    """
    now = now or timezone.now()
    with transaction.atomic():
        SetAsideUsage.objects.create(at=now, reason=reason.replace("\x00", "\\x00")[:2000], record=_as_text(f))
        for charged in (f, dataclasses.replace(f, cost_micros=0)):
            try:
                with transaction.atomic(), connection.cursor() as cursor:
                    for sql, params in budgets.settle_statements(_charges([charged]), now):
                        cursor.execute(sql, params)
                return
            except REFUSALS:
                continue


def _reason(exc: BaseException) -> str:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {first}".rstrip(": ")


class Writer:
    """Queues finished requests and replica uses; writes them from background tasks.

    ``run_db`` runs a function on an ORM thread. ``write_batch``, when given,
    writes a batch instead of ``write`` on that thread (gateway.pgpath's, on
    the event loop). Once a minute it also deletes the rate-limit windows
    nothing reads any more, and every LLMGW_GATEWAY_LEASE_S / 4 it renews
    this process's leases (gateway.writes.leases).
    """

    def __init__(self, run_db, flush_every_s: float, touch_every_s: float, write_batch=None, busy=None) -> None:
        """``busy``: the replicas with a request in flight now, touched at every flush of last uses."""
        self.run_db = run_db
        self.busy = busy or (lambda: ())
        self.write_batch = write_batch
        self.flush_every_s = flush_every_s
        self.touch_every_s = touch_every_s
        self.queue: list[Finished] = []
        self.touched: dict[str, datetime] = {}
        self.set_aside = 0
        """Records this process set aside (the database's count is what /metrics gives)."""
        self._lock = threading.Lock()
        self._tasks: list[asyncio.Task] = []
        self._closing: asyncio.Event | None = None

    def start(self) -> None:
        if not self._tasks:
            self._closing = asyncio.Event()
            self._tasks = [
                asyncio.ensure_future(self._loop(self.renew, leases.lease_s() / leases.RENEWALS_PER_LEASE, first=True)),
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

    async def _loop(self, job, every: float, first: bool = False) -> None:
        """Run ``job`` every ``every`` seconds until ``close``; a job under way is never cut off by it."""
        failing = False
        while not self._closing.is_set():
            if not first:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._closing.wait(), every)
                if self._closing.is_set():
                    return
            first = False
            try:
                await job()
            except Exception as exc:  # noqa: BLE001 - the loop outlives any one failure; it is logged
                # Once per outage, not once per try: the flush runs every few milliseconds.
                if not failing:
                    log.warning("gateway: %s failed; will retry until it succeeds: %s", job.__name__, _reason(exc))
                failing = True
            else:
                if failing:
                    log.warning("gateway: %s succeeds again", job.__name__)
                failing = False

    async def close(self) -> None:
        """Stop the loops (waiting for a write under way), write what is queued, and end this process's leases."""
        if self._closing is not None:
            self._closing.set()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            self._tasks = []
        await self.flush()
        await self.flush_touches()
        with contextlib.suppress(Exception):
            await self.run_db(leases.release, timezone.now())

    async def flush(self) -> None:
        batch = self._take()
        if batch:
            await self._write_splitting(batch)

    async def _write_splitting(self, batch: list[Finished]) -> None:
        """Write ``batch``; what the database refuses is split in halves, and a single refused record set aside.

        Halves rather than record by record: a batch of a thousand with one
        bad record costs about twenty transactions, not a thousand. Anything
        but a refusal (the database is away) puts back what is not written
        yet, and raises.
        """
        parts = [batch]
        while parts:
            part = parts.pop()
            try:
                await self._write(part)
            except REFUSALS as exc:
                if len(part) > 1:
                    half = len(part) // 2
                    parts += [part[half:], part[:half]]  # the first half is written first
                    continue
                try:
                    await self._set_aside(part[0], exc)
                except BaseException:
                    self._put_back([f for p in [part, *reversed(parts)] for f in p])
                    raise
            except BaseException:
                self._put_back([f for p in [part, *reversed(parts)] for f in p])
                raise

    async def _write(self, part: list[Finished]) -> None:
        if self.write_batch is not None:
            await self.write_batch(part)
        else:
            await self.run_db(write, part)

    async def _set_aside(self, f: Finished, exc: BaseException) -> None:
        reason = _reason(exc)
        log.error(
            "usage: set aside a record the database refused (%s): key %s, model %r, %d+%d tokens, %d micros",
            reason,
            f.caller.key_id,
            f.model or f.requested,
            f.prompt_tokens,
            f.completion_tokens,
            f.cost_micros,
        )
        await self.run_db(set_aside, f, reason)
        self.set_aside += 1

    async def flush_touches(self) -> None:
        # A replica with a request in flight is in use now, however long ago that request began:
        # a generation longer than the idle timeout must not count as idleness.
        now = timezone.now()
        for replica_id in self.busy():
            self.touched[replica_id] = now
        if self.touched:
            times, self.touched = self.touched, {}
            await self.run_db(touch_replicas, times)

    async def prune(self) -> None:
        await self.run_db(ratelimit.db_prune, time.time())

    async def renew(self) -> None:
        await self.run_db(leases.renew, timezone.now())

    def flush_now(self) -> None:
        """Write what is queued, from this thread (at exit, when the loop is gone)."""
        batch = self._take()
        with contextlib.suppress(Exception):
            write_splitting(batch)
        with contextlib.suppress(Exception):
            if self.touched:
                touch_replicas(self.touched)


def write_splitting(batch: list[Finished]) -> None:
    """``write``, with what the database refuses split off and set aside as ``Writer`` does (at exit)."""
    parts = [batch]
    while parts:
        part = parts.pop()
        try:
            write(part)
        except REFUSALS as exc:
            if len(part) > 1:
                half = len(part) // 2
                parts += [part[half:], part[:half]]
            else:
                log.error("usage: set aside a record the database refused (%s)", _reason(exc))
                set_aside(part[0], _reason(exc))
