"""Queries sent now and read later (core.pipelined): values_list's rows, each its own, the server working meanwhile."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import DatabaseError, connection, transaction
from django.db.models import F
from django.db.models.expressions import RawSQL
from django.utils import timezone

from core.jsonrows import values_list_as_text
from core.pipelined import Sent, overlapped
from inventory.models import Node

pytestmark = pytest.mark.django_db


def some_nodes() -> None:
    now = timezone.now()
    Node.objects.create(name="a", reachable=True, last_seen=now, labels={"rack": "r1", "n": 1.5})
    Node.objects.create(name="b", reachable=False, last_seen=now - timedelta(days=3), labels={})
    Node.objects.create(name="ç", reachable=True, last_seen=None, labels={"é": "ü"}, memory_mb=2**40)


QUERIES = [
    lambda: Node.objects.order_by("name").values_list("name", "reachable", "last_seen", "memory_mb"),
    lambda: values_list_as_text(Node.objects.order_by("-name"), ("pk", "labels", "name"), ("labels",)),
    lambda: Node.objects.filter(reachable=True).order_by("pk").values_list(F("name"), "labels"),
    lambda: Node.objects.filter(name__gt="a").order_by("name").values_list("pk")[:1],
]


def test_each_query_sent_in_one_block_reads_the_rows_values_list_gives():
    some_nodes()
    want = [list(q()) for q in QUERIES]
    with overlapped():
        sent = [Sent(q()) for q in QUERIES]
    assert [s.rows() for s in sent] == want
    assert [s.rows() for s in sent] == want, "read again, the same rows"
    # Converters ran: a boolean is a bool and a time is an aware datetime, on every database.
    assert want[0][0][1] is True and want[0][0][2].tzinfo is not None


def test_a_query_sent_outside_a_block_reads_the_same():
    some_nodes()
    assert [Sent(q()).rows() for q in QUERIES] == [list(q()) for q in QUERIES]


def test_on_postgresql_the_block_is_a_pipeline_and_the_connection_leaves_it():
    from psycopg import pq

    some_nodes()
    with overlapped():
        assert connection.connection.pgconn.pipeline_status != pq.PipelineStatus.OFF
        sent = Sent(QUERIES[0]())
    assert connection.connection.pgconn.pipeline_status == pq.PipelineStatus.OFF
    assert len(sent.rows()) == 3 and Node.objects.count() == 3


def test_a_filter_no_row_passes_sends_nothing():
    some_nodes()
    with connection.execute_wrapper(lambda *a: pytest.fail("a query was sent")):
        assert Sent(Node.objects.filter(pk__in=[]).values_list("name")).rows() == []


def test_only_values_list_is_taken():
    with pytest.raises(TypeError, match="values_list"):
        Sent(Node.objects.all())
    with pytest.raises(TypeError, match="values_list"):
        Sent(Node.objects.values("name"))


def test_a_query_the_server_refuses_is_djangos_error_and_the_connection_goes_on():
    some_nodes()
    with pytest.raises(DatabaseError), transaction.atomic():
        with overlapped():
            failing = Sent(Node.objects.annotate(x=RawSQL("1 / (length(name) - 1)", ())).values_list("x"))
        failing.rows()
    assert Node.objects.count() == 3
