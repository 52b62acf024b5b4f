"""A flush's one statement stores what a beat means, for any beats a node may send.

A flush is one ``UPDATE`` reading the batch as one JSON document
(``heartbeats._batch_sql``). What a beat means is written here in the ORM,
node by node: under the node's current credential, it was seen then, it is
reachable and not lost, and each of its report's time, load and shards
replaces what was stored when it was sent and not null. Random beats (any
JSON a heartbeat's load and shards may hold, sent or not, null or not, with
or without a report's time, for nodes whose credential matches or not) are
written both ways on the same nodes, and the rows must be the same.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection, transaction
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inventory.models import Node
from inventory.writes.heartbeats import Beat, _document, write_beats

pytestmark = pytest.mark.django_db

TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",), exclude_characters="\x00"), max_size=8)
SCALAR = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False, allow_infinity=False), TEXT
)
JSON = st.recursive(SCALAR, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3))
WHEN = st.datetimes(datetime(2000, 1, 1), datetime(2100, 1, 1), timezones=st.just(UTC))
FIELDS = st.fixed_dictionaries(
    {}, optional={"load": JSON, "shard_status": JSON, "last_report_at": st.one_of(st.none(), WHEN)}
)
BEATS = st.lists(st.tuples(WHEN, FIELDS, st.booleans()), min_size=1, max_size=6)
COLUMNS = ("pk", "last_seen", "last_report_at", "load", "shard_status", "reachable", "lost", "unreachable_since")


def stored(pks: list[int]) -> list[tuple]:
    return list(Node.objects.filter(pk__in=pks).order_by("pk").values_list(*COLUMNS))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(beats=BEATS)
def test_the_batch_stores_what_each_beat_means(db, beats):
    then = datetime(2020, 1, 1, tzinfo=UTC)
    with transaction.atomic():
        nodes = [
            Node.objects.create(
                name=f"n{i}",
                credential_digest=f"d{i}",
                last_seen=then,
                last_report_at=then,
                load={"before": i},
                shard_status=[{"id": f"s{i}"}],
                reachable=False,
                lost=True,
                unreachable_since=then + timedelta(seconds=i),
            )
            for i in range(len(beats))
        ]
        pks = [n.pk for n in nodes]
        # A beat under a credential the node no longer has is not written by either statement.
        rows = [
            (n.pk, n.credential_digest if current else "revoked", Beat(at, fields))
            for n, (at, fields, current) in zip(nodes, beats, strict=True)
        ]
        with transaction.atomic():
            with connection.cursor() as cursor:
                write_beats(cursor, rows)
            batch = stored(pks)
            transaction.set_rollback(True)
        for pk, digest, beat in rows:
            sent = {name: value for name, value in beat.fields.items() if value is not None}
            Node.objects.filter(pk=pk, credential_digest=digest).update(
                last_seen=beat.last_seen, reachable=True, lost=False, unreachable_since=None, **sent
            )
        assert batch == stored(pks)
        transaction.set_rollback(True)


@given(
    st.lists(
        st.tuples(
            st.integers(1, 2**63 - 1),
            st.text(max_size=8),
            st.none()
            | st.dictionaries(
                st.text(max_size=4), st.integers() | st.floats(allow_nan=False, allow_infinity=False), max_size=3
            ),
        ),
        max_size=5,
    )
)
def test_a_batch_document_reads_back_as_its_rows_whatever_the_ints(rows):
    """orjson writes the batch; an int past 64 bits (which orjson refuses) sends it to json, the same values."""
    batch = [[pk, digest, "2026-12-07T00:00:00+00:00", None, load, None] for pk, digest, load in rows]
    assert json.loads(_document(batch)) == batch
