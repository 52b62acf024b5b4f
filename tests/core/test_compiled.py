"""core.compiled: a queryset compiled once answers, for any values, what the queryset built each time answers."""

from __future__ import annotations

import gc
import threading

import pytest
from django.db import connection, transaction
from django.db.transaction import TransactionManagementError
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.compiled import CompiledQuery
from inventory.models import GPU, JoinToken, Node

pytestmark = pytest.mark.django_db

BY_NAME = CompiledQuery(lambda name: Node.objects.filter(name=name))
TOKEN = CompiledQuery(lambda digest: JoinToken.objects.filter(digest=digest).values_list("name", "revoked_at")[:1])
PAIR = CompiledQuery(lambda a, b: Node.objects.filter(name=a, machine_id=b).values_list("name", "load", "last_seen"))
LOCKED = CompiledQuery(lambda name: Node.objects.select_for_update().filter(name=name))

names = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=20)


def _fields(node: Node) -> dict:
    return {f.attname: getattr(node, f.attname) for f in Node._meta.concrete_fields}


@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=names, load=st.none() | st.dictionaries(names, st.integers() | names, max_size=3))
def test_instances_are_the_querysets_own(name, load):
    Node.objects.filter(name=name).delete()
    Node.objects.create(name=name, machine_id="m", load=load, last_seen=timezone.now(), labels={"rack": "r1"})
    made = BY_NAME.first(name)
    expected = Node.objects.get(name=name)
    assert _fields(made) == _fields(expected)
    assert made._state.db == "default" and not made._state.adding
    assert PAIR.rows(name, "m") == list(
        Node.objects.filter(name=name, machine_id="m").values_list("name", "load", "last_seen")
    )
    assert PAIR.rows(name, "other") == []


def test_a_missing_row_is_none_and_values_list_rows_are_tuples():
    JoinToken.objects.create(name="t", digest="d" * 64)
    assert TOKEN.rows("d" * 64) == [("t", None)]
    assert TOKEN.rows("e" * 64) == []
    assert BY_NAME.first("nobody") is None


@pytest.mark.django_db(transaction=True)
def test_select_for_update_outside_a_transaction_raises_as_the_orm_does():
    Node.objects.create(name="locked", last_seen=timezone.now())
    with transaction.atomic():
        assert LOCKED.first("locked").name == "locked"
    with pytest.raises(TransactionManagementError):
        LOCKED.first("locked")


def test_a_value_the_orm_rewrites_is_refused_when_compiled():
    contains = CompiledQuery(lambda part: Node.objects.filter(name__contains=part))
    with pytest.raises(ValueError, match="rewrites"):
        contains.first("x")
    related = CompiledQuery(lambda uuid: GPU.objects.select_related("node").filter(uuid=uuid))
    with pytest.raises(ValueError, match="one model's own columns"):
        related.first("x")


def test_the_wrong_number_of_values_and_the_wrong_reader_are_refused():
    with pytest.raises(TypeError, match="takes 1 values, not 2"):
        BY_NAME.first("a", "b")
    with pytest.raises(TypeError, match="call rows"):
        TOKEN.instances("x")
    with pytest.raises(TypeError, match="call instances"):
        BY_NAME.rows("x")


def test_a_sent_query_reads_the_rows_a_run_one_reads_and_goes_out_in_the_pipeline():
    """send(): the same rows as rows(), read after the block; in a pipeline on PostgreSQL, a plain query elsewhere."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from core.pipelined import overlapped

    now = timezone.now()
    for i in range(3):
        Node.objects.create(name=f"n{i}", machine_id="m", load={"i": i}, last_seen=now)
    with CaptureQueriesContext(connection) as seen, overlapped():
        sent = [PAIR.send(f"n{i}", "m") for i in range(3)] + [PAIR.send("n9", "m")]
        piped = connection.connection.pgconn.pipeline_status
    assert [s.rows() for s in sent] == [PAIR.rows(f"n{i}", "m") for i in range(3)] + [[]]
    assert len(seen.captured_queries) == 4
    assert piped != 0, "sent inside a pipeline (libpq PQ_PIPELINE_OFF is 0)"
    with pytest.raises(TypeError, match="values_list"):
        BY_NAME.send("n0")
    with pytest.raises(TypeError, match="2 values"):
        PAIR.send("n0")


@pytest.mark.django_db(transaction=True)
def test_a_query_first_run_on_a_thread_that_ends_keeps_none_of_its_sessions_open():
    """The plan outlives the thread that compiled it; the thread's connection must not (a lane's lookup thread)."""

    def sessions() -> int:
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()")
            return cursor.fetchone()[0]

    fresh = CompiledQuery(lambda name: Node.objects.filter(name=name).values_list("pk"))
    before = sessions()
    thread = threading.Thread(target=lambda: fresh.rows("nobody"))
    thread.start()
    thread.join()
    gc.collect()
    assert sessions() == before
    assert fresh.rows("nobody") == []  # and the plan still runs, on this thread's connection


def test_making_a_plan_opens_no_connection_of_its_own(monkeypatch):
    """In a process whose pool is full, a thread holding its connection and making a plan must not wait for another.

    Two such threads, each holding one of the pool's connections, would each wait for the other's (llmgw
    serve's first registrations, with LLMGW_ADMIN_DB_CONNECTIONS=2, waited out the pool's 10 s and got 503).
    """
    from django.db.backends.base.base import BaseDatabaseWrapper

    opened = []
    connect = BaseDatabaseWrapper.connect
    monkeypatch.setattr(BaseDatabaseWrapper, "connect", lambda self: (opened.append(self), connect(self))[1])
    locked = CompiledQuery(lambda name: Node.objects.select_for_update().filter(name=name))
    listed = CompiledQuery(lambda name: Node.objects.filter(name=name).values_list("pk", "load", "last_seen"))
    with transaction.atomic():
        assert locked.instances("nobody") == []
        assert listed.rows("nobody") == []
    assert opened == []
