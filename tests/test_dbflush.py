"""The teardown's flush survives being picked as a deadlock's victim (tests/dbflush.py says why it can be)."""

from __future__ import annotations

import re
import threading
import time

import psycopg
import pytest
from django.core.management.color import no_style
from django.core.management.sql import sql_flush
from django.db import OperationalError, connection
from django.db.backends.postgresql.operations import DatabaseOperations

from tests import dbflush

pytestmark = pytest.mark.django_db(transaction=True)


def truncated_tables(sql_list) -> list[str]:
    (truncate,) = [sql for sql in sql_list if sql.startswith("TRUNCATE")]
    return re.findall(r'"([^"]+)"', truncate)


def waiting_for_a_lock(watcher: psycopg.Connection, pid: int) -> bool:
    return watcher.execute("SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()[0]


def open_connection(**options) -> psycopg.Connection:
    params = {k: v for k, v in connection.get_connection_params().items() if k != "cursor_factory"}
    return psycopg.connect(**params, **options)


def test_a_flush_aborted_by_a_deadlock_is_tried_again_and_the_other_transaction_goes_on():
    """A stand-in for the server: a transaction reads the TRUNCATE's last table, the TRUNCATE takes the first and
    waits for the last, then the transaction reads the first. PostgreSQL finds the cycle in the TRUNCATE's backend,
    whose deadlock_timeout ran out first, and aborts it; the retry waits for the transaction and then succeeds."""
    sql_list = sql_flush(no_style(), connection, allow_cascade=False)
    first, last = truncated_tables(sql_list)[0], truncated_tables(sql_list)[-1]
    tries = []

    def counted(ops, sql):
        tries.append(time.monotonic())
        return DatabaseOperations.execute_sql_flush.__wrapped__(ops, sql)

    flush = dbflush.through_deadlocks(counted)
    flusher_pid = connection.cursor().connection.info.backend_pid
    server = open_connection(options="-c lock_timeout=20s")
    watcher = open_connection(autocommit=True)
    done = []

    def server_transaction():
        deadline = time.monotonic() + 20
        while not waiting_for_a_lock(watcher, flusher_pid):  # the TRUNCATE holds the first table, wants the last
            assert time.monotonic() < deadline
            time.sleep(0.02)
        server.execute(f'SELECT 1 FROM "{first}" LIMIT 0')  # the cycle
        time.sleep(0.3)
        server.commit()
        done.append("committed")

    try:
        server.execute(f'SELECT 1 FROM "{last}" LIMIT 0')
        other = threading.Thread(target=server_transaction)
        other.start()
        flush(connection.ops, sql_list)
        other.join(20)
    finally:
        server.close()
        watcher.close()
    assert done == ["committed"] and len(tries) == 2


def test_a_flush_that_fails_for_another_reason_is_not_tried_again():
    tries = []

    def failing(ops, sql):
        tries.append(sql)
        raise OperationalError("the server closed the connection") from psycopg.OperationalError("closed")

    with pytest.raises(OperationalError):
        dbflush.through_deadlocks(failing)(connection.ops, [])
    assert len(tries) == 1


def test_every_flush_of_the_test_process_retries_deadlocks():
    assert DatabaseOperations.execute_sql_flush.retries_deadlocks
