"""Queries sent to the database now and their rows read later, so PostgreSQL works while Python does.

A long listing read page by page spends its time in turns: the server reads
a page, then Python builds it while the server waits, then the server reads
the next. On a host whose cores both sit idle half of that time, the next
page's queries can be sent before this page is built: inside
:func:`overlapped`, PostgreSQL runs each query as it arrives (psycopg's
pipeline mode) and keeps its rows for the connection until the block ends.

A :class:`Sent` is one ``values_list`` queryset sent that way; its rows are
what ``values_list`` would give (the same SQL, the same converters), read
only later. Where libpq has no pipeline mode the query runs when it is
sent: the same rows, without the overlap.

What the block holds must not use the database: a query run inside it waits
for every query sent before it, which is no worse than not overlapping, but
its rows come only once the block ends.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import psycopg
from django.core.exceptions import EmptyResultSet
from django.db import connections
from django.db.models import QuerySet
from django.db.models.query import ValuesListIterable
from django.db.models.sql.compiler import SQLCompiler


@contextlib.contextmanager
def overlapped(using: str = "default") -> Iterator[None]:
    """A block whose :class:`Sent` queries the server runs while the block goes on; their rows are in when it ends."""
    database = connections[using]
    if not psycopg.Pipeline.is_supported():
        yield
        return
    database.ensure_connection()
    # A query the server refused surfaces when the block ends, as Django's own error (DatabaseError's kin).
    with database.wrap_database_errors, database.connection.pipeline():
        yield


class Sent:
    """A ``values_list`` queryset's query, sent when this is made; :meth:`rows` reads its answer.

    A filter no row can pass (an empty ``__in``) sends nothing and reads no rows,
    as the queryset itself would.
    """

    def __init__(self, rows: QuerySet) -> None:
        if rows._iterable_class is not ValuesListIterable:
            raise TypeError("Sent reads the tuples of values_list(); name the columns it reads")
        compiler = rows.query.get_compiler(using=rows.db)
        try:
            sql, params = compiler.as_sql()
        except EmptyResultSet:
            sql, params = None, ()
        self._send(compiler, sql, params, rows.db)

    @classmethod
    def statement(cls, compiler: SQLCompiler, sql: str, params: Sequence[Any], using: str = "default") -> Sent:
        """A ``values_list`` query's SQL already compiled (``compiler.as_sql()``'s, run with ``params``), sent now."""
        sent = cls.__new__(cls)
        sent._send(compiler, sql, params, using)
        return sent

    def _send(self, compiler: SQLCompiler, sql: str | None, params: Sequence[Any], using: str) -> None:
        self._compiler = compiler
        self._cursor = None
        self._rows: list[tuple] = []
        if sql is None:
            return
        self._cursor = connections[using].cursor()
        self._cursor.execute(sql, params)

    def rows(self) -> list[tuple]:
        """The query's rows as ``values_list`` gives them (each column through its field's converters)."""
        if self._cursor is not None:
            try:
                fetched = self._cursor.fetchall()
            finally:
                self._cursor.close()
                self._cursor = None
            self._rows = list(self._compiler.results_iter(results=[fetched], tuple_expected=True))
        return self._rows
