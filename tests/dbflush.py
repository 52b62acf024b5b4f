"""The test database's flush, made to survive a live server's transactions.

A test with a live ``llmgw serve`` on the test database (the gateway's usage
writes, a reconcile pass every second) ends with that server still at work,
and the teardown's one TRUNCATE of every table takes its locks table by
table, in an order no transaction of the server's shares. A server
transaction holding one table and wanting the next can then meet the
TRUNCATE holding the second and wanting the first, and PostgreSQL aborts one
of the two. When the TRUNCATE is the one aborted, nothing is half-done (it
is one statement in its own transaction), and trying again waits for the
server's transaction to end. Production never truncates, so this belongs to
the tests, not to the server's code. tests/test_dbflush.py holds it.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence

import psycopg
from django.db import OperationalError
from django.db.backends.postgresql.operations import DatabaseOperations

TRIES = 5

Flush = Callable[[DatabaseOperations, Sequence[str]], None]


def through_deadlocks(flush: Flush) -> Flush:
    """``flush``, tried again (up to TRIES times in all) when PostgreSQL aborted it as a deadlock's victim."""

    @functools.wraps(flush)
    def tried(ops: DatabaseOperations, sql_list: Sequence[str]) -> None:
        for attempt in range(1, TRIES + 1):
            try:
                return flush(ops, sql_list)
            except OperationalError as exc:
                if attempt == TRIES or not isinstance(exc.__cause__, psycopg.errors.DeadlockDetected):
                    raise
                time.sleep(0.1 * attempt)

    tried.retries_deadlocks = True  # type: ignore[attr-defined]
    return tried


def install() -> None:
    """Every PostgreSQL flush in this test process retries through deadlocks (installed once, however often called)."""
    if not getattr(DatabaseOperations.execute_sql_flush, "retries_deadlocks", False):
        DatabaseOperations.execute_sql_flush = through_deadlocks(DatabaseOperations.execute_sql_flush)
