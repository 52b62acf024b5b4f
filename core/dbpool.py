"""The admin listener's PostgreSQL connections: one pool per process, shared by its requests.

Under ASGI, Django runs each request's synchronous code on a thread of its
own, and a connection belongs to the thread that opened it, so no request
ever reuses another's: every registration, report and page opened a
PostgreSQL connection and closed it again (llmgw.asgi). Opening one costs
PostgreSQL a process fork and its authentication, which made up most of a
registration's cost (bench/register_cost.py). A process that serves the
admin listener therefore keeps a psycopg pool (Django's own pooling, over
psycopg_pool) of at most LLMGW_ADMIN_DB_CONNECTIONS connections; a request
borrows one and hands it back as it finishes.

Only the admin listener's processes pool. The gateway's processes keep a
connection per worker thread, which live as long as the process (and some of
those connections are set to skip the commit's fsync: gateway.proxy), and
Celery's processes are forked from a parent, whose pool they must not share.

What a pool changes for a caller:

- a thread that lives on (the fast lane's lookups) hands its connection
  back when done (``give_back``), or it would hold a place in the pool for
  good;
- a request that finds every connection in use waits up to
  ``WAIT_S`` for one, then gets the 503 of a database that does not answer
  (core.errors), which an agent retries;
- a connection is checked before it is lent (``CONN_HEALTH_CHECKS``), so one
  that died while idle (a failover, a restarted server) is replaced, not
  handed to a request.
"""

from __future__ import annotations

from django.conf import settings
from django.db import connections

WAIT_S = 10.0
"""How long a request waits for a connection when all of the pool's are lent."""

IDLE_S = 60.0
"""A connection idle this long is closed, down to one kept open."""


def pool_this_process(size: int) -> bool:
    """Pool this process's PostgreSQL connections, at most ``size``; True once they are pooled.

    Call it before the process opens its first connection: the settings it
    changes are read as a connection is opened, and a connection opened
    before would not know how to hand itself back. Calling it again is
    harmless.
    """
    database = settings.DATABASES["default"]
    if database.get("OPTIONS", {}).get("pool"):
        return True
    if connections["default"].connection is not None:
        raise RuntimeError("core.dbpool.pool_this_process: this process already opened a connection")
    database["CONN_MAX_AGE"] = 0  # Django refuses persistent connections with a pool: the pool keeps them
    database["CONN_HEALTH_CHECKS"] = True
    # Told apart in pg_stat_activity from the gateway's and the worker's, unless the URL names them all.
    database.setdefault("OPTIONS", {}).setdefault("application_name", "llmgw-admin")
    database["OPTIONS"]["pool"] = {
        "min_size": 1,
        "max_size": size,
        "timeout": WAIT_S,
        "max_idle": IDLE_S,
        "name": "llmgw-admin",
    }
    return True


def pooled() -> bool:
    """True in a process whose connections come from a pool (pool_this_process)."""
    return bool(settings.DATABASES["default"].get("OPTIONS", {}).get("pool"))


def give_back() -> None:
    """Hand this thread's connection back to the pool; nothing when the process does not pool.

    Without a pool a connection kept by a thread that lives on is the cheap
    choice (it is opened once), so it is kept.
    """
    if not pooled():
        return
    for conn in connections.all(initialized_only=True):
        if conn.connection is not None and not conn.in_atomic_block:
            conn.close()
