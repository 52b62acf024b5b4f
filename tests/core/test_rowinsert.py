"""core.rowinsert stores the rows bulk_create stores, whatever the values: Hypothesis over every column of the
models the ingestion inserts (cards, ports, health events), on PostgreSQL."""

from __future__ import annotations

import datetime

import pytest
from django.db import DatabaseError, models, transaction
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from core.rowinsert import insert_rows
from inventory.models import GPU, CardHealthEvent, IBPort, Node

pytestmark = pytest.mark.django_db

# Text PostgreSQL can hold: no NUL, no lone surrogate (neither can be stored through the ORM either).
TEXT = st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00")
KEYS = st.text(TEXT, max_size=8)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(TEXT, max_size=20),
)
JSON = st.recursive(
    SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=4), max_leaves=12
)
WHEN = st.datetimes(
    min_value=datetime.datetime(1970, 1, 1), max_value=datetime.datetime(2200, 1, 1), timezones=st.just(datetime.UTC)
)
INTS = {
    models.PositiveSmallIntegerField: (0, 32767),
    models.PositiveIntegerField: (0, 2**31 - 1),
    models.IntegerField: (-(2**31), 2**31 - 1),
    models.BigIntegerField: (-(2**63), 2**63 - 1),
}


def value_for(field: models.Field) -> st.SearchStrategy:
    if isinstance(field, models.JSONField):
        # The ORM writes None as SQL NULL; a NOT NULL JSON column cannot take it from either path.
        return JSON.filter(lambda v: v is not None) if not field.null else JSON
    if isinstance(field, models.CharField | models.TextField):
        # Not only text: the ORM turns what else it is given into the column's type (True is "True").
        return st.text(TEXT, max_size=field.max_length or 50) | st.booleans() | st.integers(-999, 999)
    if isinstance(field, models.DateTimeField):
        values = WHEN
    elif isinstance(field, models.BooleanField):
        values = st.booleans()
    elif isinstance(field, models.FloatField):
        values = st.floats(allow_nan=False, allow_infinity=False) | st.integers(-(2**53), 2**53)
    else:
        low, high = next(r for t, r in INTS.items() if type(field) is t)
        values = st.integers(low, high) | st.booleans() | st.integers(max(low, -99), min(high, 99)).map(float)
    return st.none() | values if field.null else values


def columns(model: type[models.Model]) -> list[models.Field]:
    return [f for f in model._meta.concrete_fields if f is not model._meta.pk and not f.is_relation]


# Rows that meet the model's constraints, as a report's do: distinct keys, cards numbered as MIG's rule has
# them, no negative memory or rate. Untidy examples keep whatever was drawn, and are mostly refused.
TIDY = {
    GPU: lambda i, row: {**row, "index": i, "parent_index": None, "memory_mb": abs(row["memory_mb"] or 0)},
    IBPort: lambda i, row: {**row, "hca": f"mlx5_{i}", "port": 1, "rate_gbps": abs(row["rate_gbps"] or 0.0)},
    CardHealthEvent: lambda i, row: row,
}


def rows_of(model: type[models.Model]) -> st.SearchStrategy:
    drawn = st.lists(st.fixed_dictionaries({f.attname: value_for(f) for f in columns(model)}), min_size=1, max_size=6)
    return st.tuples(drawn, st.booleans()).map(
        lambda d: [TIDY[model](i, row) for i, row in enumerate(d[0])] if d[1] else d[0]
    )


def stored(model: type[models.Model], node: Node) -> list[dict]:
    names = [f.attname for f in columns(model)]
    return list(model.objects.filter(node=node).order_by("pk").values(*names))


def outcome(write, model: type[models.Model], node_name: str, rows: list[dict]):
    """What one path did with the rows, in a savepoint of its own: the rows as stored, or the kind of refusal."""
    try:
        with transaction.atomic():
            node = Node.objects.create(name=node_name)
            made = write([model(node=node, **row) for row in rows])
            keys = list(model.objects.filter(node=node).order_by("pk").values_list("pk", flat=True))
            assert [m.pk for m in made] == keys and all(not m._state.adding for m in made)
            rows_stored = stored(model, node)
            transaction.set_rollback(True)  # the next example starts from the same empty tables
            return "stored", rows_stored
    except DatabaseError as exc:
        return "refused", type(exc).__name__


@pytest.mark.parametrize("model", [GPU, IBPort, CardHealthEvent], ids=lambda m: m.__name__)
@settings(max_examples=100, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_the_rows_are_bulk_creates_and_so_are_the_refusals(db, model, data):
    """The same rows stored, or the same kind of refusal (a check constraint, a duplicate card, a value a column
    cannot hold), and nothing stored by either."""
    rows = data.draw(rows_of(model))
    ours = outcome(lambda objs: insert_rows(model, objs), model, "ours", rows)
    theirs = outcome(model.objects.bulk_create, model, "theirs", rows)
    event(theirs[0])
    assert ours == theirs
