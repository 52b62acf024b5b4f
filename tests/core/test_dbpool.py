"""core.dbpool: which processes pool their PostgreSQL connections, and threads that hand theirs back.

The pool at work in a real admin process (240 registrations in a handful of
sessions, six clients on two connections, every connection killed under it)
is tests/core/test_serve.py::test_a_registration_storm_borrows_from_the_admin_pool_and_survives_its_connections_dying.
"""

from __future__ import annotations

import copy
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.conf import settings
from django.db import connection
from django.test import override_settings

from agentapi import fast
from core import dbpool

# Each test changes a copy of DATABASES that no connection of the suite's reads; Django warns all the same.
pytestmark = pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")


def databases(engine: str) -> dict:
    chosen = copy.deepcopy(settings.DATABASES)
    chosen["default"]["ENGINE"] = engine
    return chosen


def test_a_postgresql_process_pools_at_most_the_size_asked_with_each_connection_checked_before_it_is_lent():
    with override_settings(DATABASES=databases("django_prometheus.db.backends.postgresql")):
        assert dbpool.pool_this_process(3) and dbpool.pool_this_process(7), "a second call changes nothing"
        chosen = settings.DATABASES["default"]
        assert chosen["OPTIONS"]["pool"]["max_size"] == 3 and chosen["CONN_MAX_AGE"] == 0
        assert chosen["CONN_HEALTH_CHECKS"], "a connection is checked before it is lent"
        assert chosen["OPTIONS"]["application_name"] == "llmgw-admin" and dbpool.pooled()


@pytest.mark.django_db
def test_pooling_after_a_connection_was_opened_is_refused():
    """That connection could not hand itself back to a pool it did not come from."""
    connection.ensure_connection()
    postgresql = databases("django_prometheus.db.backends.postgresql")
    with override_settings(DATABASES=postgresql), pytest.raises(RuntimeError, match="already opened a connection"):
        dbpool.pool_this_process(3)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("pooled", [True, False])
def test_the_fast_lanes_lookup_hands_its_connection_back_only_where_the_process_pools(monkeypatch, pooled):
    """Its thread lives on: holding a pooled connection for good would take a place in the pool for good;
    without a pool, keeping it spares opening one per lookup."""
    monkeypatch.setattr(dbpool, "pooled", lambda: pooled)

    def look_up() -> bool:
        assert fast._lookup("no-such-credential") is None
        return connection.connection is not None

    with ThreadPoolExecutor(1) as thread:
        assert thread.submit(look_up).result() is not pooled
