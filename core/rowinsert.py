"""New rows of a model in one INSERT whose values travel as one JSON document: ``bulk_create`` made cheap.

A node's registration inserts its cards and ports, eight or more rows of
twenty to thirty columns each. Through ``bulk_create`` on PostgreSQL Django
sends each column as an array (``UNNEST``), and psycopg quotes every element
of every array in Python: at 10,000 registrations that was the largest part
of the control host's CPU for each (bench/register_cost.py --profile). Here
the rows become one JSON array, encoded by the standard library's C encoder
and read back into columns by PostgreSQL (``jsonb_to_recordset``): one
parameter, and no per-value work in Python beyond each field's own
conversion to its Python type (``get_prep_value``, as the ORM applies it).

The rows stored are the ORM's: a JSON column's value is the jsonb of the
same Python value (``None`` is SQL NULL, as the ORM writes it), a timestamp
keeps its microseconds, a float its exact value (the encoder writes the
shortest text that reads back as the same double). Values that JSON cannot
carry (NaN, infinity, NUL characters) are refused here as PostgreSQL would
refuse them from the ORM; the callers insert what report_schema has
already held to its columns. tests/core/test_rowinsert.py holds the rows to
``bulk_create``'s over random values.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple, TypeVar

from django.db import connections, models, router

M = TypeVar("M", bound=models.Model)


def insert_rows(model: type[M], objs: Iterable[M]) -> list[M]:
    """Insert ``objs`` (unsaved instances of ``model``) in one statement; their primary keys are set, as
    ``bulk_create`` sets them. No signals are sent, as ``bulk_create`` sends none."""
    objs = list(objs)
    if not objs:
        return objs
    db = router.db_for_write(model)
    connection = connections[db]
    statement = _statement(model, db)
    raw = [[f.pre_save(obj, add=True) for f in statement.fields] for obj in objs]
    if any(hasattr(value, "resolve_expression") for values in raw for value in values):
        # A value the database computes (an expression, a db_default) is bulk_create's to write.
        return model._default_manager.using(db).bulk_create(objs)
    converters = statement.converters
    rows = [{column: convert(v) for (column, convert), v in zip(converters, values, strict=True)} for values in raw]
    sql, returning = statement.sql, statement.returning
    document = json.dumps(rows, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    with connection.cursor() as cursor:
        cursor.execute(sql, [document])
        keys = cursor.fetchall() if returning else []
    # PostgreSQL inserts (and returns) the rows in the order jsonb_to_recordset yields them, the array's:
    # what Django's own bulk_create relies on for UNNEST too.
    if returning:
        for obj, (key,) in zip(objs, keys, strict=True):
            setattr(obj, model._meta.auto_field.attname, key)
    for obj in objs:
        obj._state.adding = False
        obj._state.db = db
    return objs


class _Statement(NamedTuple):
    """A model's INSERT on one database: its fields, each column's converter, the SQL, whether it returns keys."""

    fields: list[models.Field]
    converters: list[tuple[str, Callable[[Any], Any]]]
    sql: str
    returning: bool


# (model, database alias) -> its statement: the same for every insert, and a tenth of a small insert's CPU to build.
_statements: dict[tuple[type[models.Model], str], _Statement] = {}


def _statement(model: type[models.Model], db: str) -> _Statement:
    known = _statements.get((model, db))
    if known is not None:
        return known
    connection = connections[db]
    meta = model._meta
    fields = [f for f in meta.concrete_fields if f is not meta.auto_field]
    converters = [(f.column, _converter(f)) for f in fields]
    columns = ", ".join(connection.ops.quote_name(f.column) for f in fields)
    # The record's column names are the JSON keys: each is quoted, as a column named "index" needs.
    record = ", ".join(f"{connection.ops.quote_name(f.column)} {f.db_type(connection)}" for f in fields)
    returning = connection.ops.quote_name(meta.pk.column) if meta.auto_field else None
    sql = (
        f"INSERT INTO {connection.ops.quote_name(meta.db_table)} ({columns}) "
        f"SELECT {columns} FROM jsonb_to_recordset(%s::jsonb) AS r({record})"
        + (f" RETURNING {returning}" if returning else "")
    )
    statement = _statements[(model, db)] = _Statement(fields, converters, sql, bool(returning))
    return statement


def _converter(field: models.Field) -> Callable[[Any], Any]:
    """How one field's value goes into the JSON document: JSON columns as they are, the rest through the
    field's own conversion (``get_prep_value``; skipped for a value already of the column's plain type, which it
    would return as it is), timestamps as ISO 8601 text."""
    if isinstance(field, models.JSONField):
        return _as_is
    plain = _PLAIN.get(field.get_internal_type())
    prep = field.get_prep_value

    def convert(value: Any) -> Any:
        if value is None or (plain is not None and type(value) is plain):
            return value
        value = prep(value)
        if isinstance(value, datetime.datetime | datetime.date | datetime.time):
            return value.isoformat()
        return value

    return convert


def _as_is(value: Any) -> Any:
    return value


# Internal types whose get_prep_value returns a value of this exact type unchanged.
_PLAIN: dict[str, type] = {
    "CharField": str,
    "TextField": str,
    "IntegerField": int,
    "BigIntegerField": int,
    "SmallIntegerField": int,
    "PositiveIntegerField": int,
    "PositiveBigIntegerField": int,
    "PositiveSmallIntegerField": int,
    "BooleanField": bool,
    "FloatField": float,
    "ForeignKey": int,
}
