"""The two statements every request runs, on PostgreSQL, from the event loop itself.

Every request looks its key up and reserves on its budgets. Done with the
ORM, that work has to leave the event loop for a thread and come back, and
on the bench machine that round trip through the thread pool cost more than
the queries: each hand-over waits for the interpreter lock, and with the
loop busy that wait reached a millisecond. Here the same SQL text
(``keys.lookup_sql``, ``budgets.reserve_sql``) goes out on psycopg's async
connections, awaited on the loop like the engine's socket.

Usage batches are written here too (``gateway.writes.usage.statements``, the SQL
the ORM's writer runs as well): on a thread, the ORM's work for a batch held
the interpreter lock long enough to stall the loop, and a request that
waited behind it took 4.4 ms where the rest took 0.8 (p99 against p50).

What is rare stays on the gateway's threads with the ORM, so its logic
exists once: rate limits counted in the database (no Redis), the sentence
explaining a budget refusal, replicas' last use.

Connections come from a small pool of our own (at most
LLMGW_GATEWAY_DB_THREADS; taken, used, given back; closed on any error):
psycopg_pool would add a dependency and background workers for what is a
list and a semaphore. The connections skip waiting for the WAL's fsync on
commit, for the reason ``gateway.proxy._relax`` gives, except where usage is
written.
"""

from __future__ import annotations

import asyncio
import contextlib
import select
from datetime import datetime

import psycopg
from django.db import connections

from core.credentials import hash_token
from gateway import admission, errors, rules
from gateway.rules import Admission, Ask
from gateway.writes import budgets, keys, leases

# psycopg's own default: a statement is prepared on the server from its fifth use.
PREPARE_AFTER = 5


class _Rollback(Exception):
    """Leaves a transaction block with its work undone."""


def connection_params(alias: str = "default") -> dict | None:
    """psycopg connection keywords for a Django database; None when it is not PostgreSQL."""
    conn = connections[alias]
    if conn.vendor != "postgresql":
        return None
    params = conn.get_connection_params()
    # Django's own cursor class and adapters are for its synchronous
    # connections; these connections use psycopg's, binding on the server so
    # that statements can be prepared.
    params.pop("cursor_factory", None)
    params.pop("context", None)
    params["prepare_threshold"] = conn.settings_dict["OPTIONS"].get("prepare_threshold", PREPARE_AFTER)
    params["autocommit"] = True
    return params


# The key may be used for this model (the names it is asked by), has one
# budget over it, and no rate limit counted in the database stands in the way.
# Parameters: ``names``, the request's names (text[]); ``db_limits``,
# whether limits are counted in the database. Agrees with rules.decide (its
# model check and rules.limits); where the key is refused, or has several
# budgets, nothing is reserved and the Python side decides, by rules.decide.
# ``allowed_models`` comes as JSON text (keys.lookup_sql). Only SQL NULL and
# a JSON array are decided here, the two shapes where ``?|`` (an array's
# string elements) means what keys.model_names means; any other stored value
# (a JSON string, an object) is left to keys.model_names, reserving nothing
# here, so no value can be allowed here and refused there with its
# reservation held.
_SIMPLE = (
    "k.revoked_at IS NULL AND num_nonnulls(k.key_budget, k.team_budget, k.org_budget) = 1 "
    "AND (k.allowed_models IS NULL OR (jsonb_typeof(k.allowed_models::jsonb) = 'array' "
    "AND k.allowed_models::jsonb ?| %(names)s::text[])) "
    "AND NOT (%(db_limits)s AND num_nonnulls(k.rpm, k.tpm, k.team_rpm, k.team_tpm) > 0)"
)


def admit_sql() -> str:
    """The key looked up and, for a simple one, its budget reserved: one round trip for most requests.

    Gives the lookup's columns, then whether a reservation was tried, then the
    id of the budget reserved (NULL: none, because it was not tried or the
    budget could not take the estimate).
    """
    columns = "id, digest, revoked_at, team_id, org_id, allowed_models, rpm, tpm, team_rpm, team_tpm, " + (
        "key_budget, team_budget, org_budget"
    )
    budget = "(SELECT COALESCE(k.key_budget, k.team_budget, k.org_budget) FROM k WHERE " + _SIMPLE + ")"
    return (
        f"WITH k({columns}) AS ({keys.lookup_sql()}), "
        f"r AS ({budgets.reserve_sql(budget)} RETURNING id), "
        f"h AS ({leases.hold_sql('r')}) "
        f"SELECT k.*, {_SIMPLE}, (SELECT id FROM r) FROM k"
    )


def _has_input(conn: psycopg.AsyncConnection) -> bool:
    try:
        readable, _, _ = select.select([conn.pgconn.socket], [], [], 0)
    except (OSError, ValueError, psycopg.OperationalError):
        return True
    return bool(readable)


class PgPath:
    """Key lookups and budget reservations for one event loop."""

    def __init__(self, params: dict, size: int, run_db) -> None:
        """``run_db`` runs a function on the gateway's ORM threads, for the rare paths."""
        self.params = params
        self.size = size
        self.run_db = run_db
        self.lookup_sql = keys.lookup_sql()
        self.reserve_sql = budgets.reserve_sql()
        self.admit_sql = admit_sql()
        self.hold_sql = leases.hold_sql()
        self._idle: list[psycopg.AsyncConnection] = []
        self._slots = asyncio.Semaphore(size)

    @classmethod
    def for_database(cls, size: int, run_db, alias: str = "default") -> PgPath:
        return cls(connection_params(alias), size, run_db)

    async def _connect(self) -> psycopg.AsyncConnection:
        conn = await psycopg.AsyncConnection.connect(**self.params)
        await conn.execute("SET synchronous_commit TO OFF")
        return conn

    @contextlib.asynccontextmanager
    async def _connection(self):
        """A connection of the pool's, waited for when all ``size`` are in use.

        Bounded, not one per request: opening a PostgreSQL connection costs the
        server a process, and a burst that opened one per request spent its
        time there (480 req/s in process against 1,700 with the bound).
        """
        async with self._slots:
            conn = await self._take()
            try:
                yield conn
            except BaseException:
                # Broken, or left mid-transaction by a cancelled request: never reused.
                await conn.close()
                raise
            if conn.closed:
                return
            self._idle.append(conn)

    async def _take(self) -> psycopg.AsyncConnection:
        """An idle connection that still works, else a new one.

        An idle connection has nothing to read unless the server said
        something on its own, which for an idle session means it is ending it
        (a restart, a failover, an administrator): such a connection is
        dropped here, before a statement that may reserve is sent on it.
        """
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed and not _has_input(conn):
                return conn
            with contextlib.suppress(Exception):
                conn.pgconn.finish()
        return await self._connect()

    async def _once_more_on_failure(self, work):
        """Run read-only ``work(conn)``; a connection that went stale while idle is replaced once."""
        try:
            async with self._connection() as conn:
                return await work(conn)
        except psycopg.OperationalError:
            self._drop_idle()
            async with self._connection() as conn:
                return await work(conn)

    def _drop_idle(self) -> None:
        # The server went away or restarted: every idle connection is as stale.
        idle, self._idle = self._idle, []
        for conn in idle:
            with contextlib.suppress(Exception):
                conn.pgconn.finish()

    async def authenticate(self, secret: str) -> Admission:
        """The caller behind a key, or the 401 (``admission.authenticate``'s, on the loop)."""
        if not secret:
            return Admission(None, errors.unauthorized(keys.NO_KEY))
        wanted = hash_token(secret)
        row = await self._read(self.lookup_sql, {"digest": wanted})
        if row is None and await self._upgraded(secret):
            row = await self._read(self.lookup_sql, {"digest": wanted})
        caller, why = keys.caller_from_row(row, wanted)
        return Admission(caller, None if caller else errors.unauthorized(why))

    async def _upgraded(self, secret: str) -> bool:
        """Whether a key not found may have been stored under the old HMAC, and is now stored anew if it was.

        Rare (keys issued before core.credentials' policy, on first use, or unknown keys
        where the old secret is still set), so on the ORM's threads (keys.upgrade_legacy).
        """
        if keys.legacy_secret() is None:
            return False
        await self.run_db(keys.upgrade_legacy, secret)
        return True

    async def admit(self, secret: str, ask: Ask) -> Admission:
        """What ``admission.admit`` decides (``rules.decide``), in one statement for the common request."""
        if not secret:
            return Admission(None, errors.unauthorized(keys.NO_KEY))
        wanted = hash_token(secret)
        row, tried, reserved = await self._admit_row(wanted, ask)
        if row is None and await self._upgraded(secret):
            row, tried, reserved = await self._admit_row(wanted, ask)
        caller, why = keys.caller_from_row(row, wanted)
        if caller is None:
            return Admission(None, errors.unauthorized(why))
        if reserved is not None:
            # The statement decided as rules.decide does (see _SIMPLE) and reserved on the one budget.
            return Admission(caller, reserved=rules.reservation((reserved,), ask.estimate))
        decision = rules.decide(caller, ask)
        refused = decision.refusal()
        if refused is not None:
            return refused
        if decision.count_limits:
            # Rate limits counted in the database: the ORM's path, whole.
            return await self.run_db(admission.admit_caller, caller, ask)
        if not decision.reserve:
            return decision.admitted()
        if tried:
            # The statement tried this key's one budget, and it could not take the estimate.
            return await self.run_db(admission.over_budget, caller, list(decision.reserve), decision.estimate, ask.now)
        failed = await self._reserve(sorted(decision.reserve), decision.estimate, ask.now)
        if failed is not None:
            return await self.run_db(admission.over_budget, caller, [failed], decision.estimate, ask.now)
        return decision.admitted()

    async def _admit_row(self, wanted: str, ask: Ask):
        """The key's row for ``admit_sql`` (or ``lookup_sql`` with no price), whether it tried to reserve, and what."""
        if ask.estimate is None:
            return await self._read(self.lookup_sql, {"digest": wanted}), False, None
        params = budgets.reserve_params(ask.estimate, ask.now, digest=wanted, names=ask.names, db_limits=ask.db_limits)
        found = await self._read(self.admit_sql, params)
        return (found[:13], found[13], found[14]) if found else (None, False, None)

    async def readmit(self, caller: rules.Caller, held: int, estimate: int | None, now: datetime):
        """``admission.readmit`` on the loop: (what is held now, the refusal if any)."""
        if not caller.budget_ids:
            return 0, None
        change = rules.adjustment(held, estimate)
        if change > 0:
            failed = await self._reserve(sorted(caller.budget_ids), change, now)
            if failed is not None:
                refused = await self.run_db(admission.over_budget, caller, [failed], change, now)
                return held, refused.refused
        elif change < 0:
            await self._release(budgets.settle_statements(budgets.releases(caller.budget_ids, -change), now))
        return held + change, None

    async def _release(self, statements: list[budgets.Statement]) -> None:
        """Give reservations back, in one transaction (not durable: a reservation lives as long as a request)."""
        async with self._connection() as conn, conn.transaction():
            for sql, params in statements:
                await conn.execute(sql, params)

    async def _read(self, sql: str, params: dict):
        async def work(conn):
            cursor = await conn.execute(sql, params)
            return await cursor.fetchone()

        if sql is self.admit_sql:
            # It may reserve: not tried twice (see _reserve). The request is
            # refused; the next ones start from fresh connections.
            try:
                async with self._connection() as conn:
                    return await work(conn)
            except psycopg.OperationalError:
                self._drop_idle()
                raise
        return await self._once_more_on_failure(work)

    async def _reserve(self, budget_ids: list[int], estimate: int, now: datetime) -> int | None:
        """``budgets.reserve`` on the loop, for keys with several budgets: all or none, in id order.

        The budget that refused, or None when all are reserved.
        """

        async def work(conn):
            failed = None
            with contextlib.suppress(_Rollback):
                async with conn.transaction():
                    for budget_id in budget_ids:
                        params = budgets.reserve_params(estimate, now, budget_id=budget_id)
                        cursor = await conn.execute(self.reserve_sql, params)
                        if cursor.rowcount != 1:
                            failed = budget_id
                            raise _Rollback
                        await conn.execute(self.hold_sql, params)
            return failed

        # Not tried again on a failure: the update may have landed before the
        # connection broke, and a second one would hold the budget twice.
        async with self._connection() as conn:
            return await work(conn)

    async def write(self, statements: list[budgets.Statement], copy: tuple[str, list[list]] | None = None) -> None:
        """Copy rows in, then run statements, in one transaction that waits for the disk.

        Usage records and settlements are the record: this commit, unlike the
        reservations', is durable. ``copy`` is a COPY … FROM STDIN statement
        and its rows.
        """
        async with self._connection() as conn, conn.transaction():
            await conn.execute("SET LOCAL synchronous_commit TO ON")
            if copy is not None:
                sql, rows = copy
                async with conn.cursor().copy(sql) as writer:
                    for row in rows:
                        await writer.write_row(row)
            for sql, params in statements:
                await conn.execute(sql, params)

    async def close(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            await conn.close()
