"""A queryset the ORM builds and compiles once, then runs with each call's values: a lookup without the ORM's
per-call Python.

Building a query (clone the queryset, add the filter, compile it to SQL) costs
Django a quarter to half a millisecond of CPU; running a lookup by a unique
key costs PostgreSQL a tenth of that. Every agent request makes such
lookups (its join token, its node by name or by credential): at 10,000
registrations on one host that was a tenth of the admin process's CPU for
each (bench/register_cost.py, bench/scale.py). So the queryset is written as
usual, in a function of the values it filters on; the first call builds it
with a marker in place of each value and compiles it, and every call after
runs that SQL with its own values, reading the rows through the same
converters the queryset would (``values_list``'s tuples, or model instances
made as ``QuerySet`` makes them for a plain queryset).

Only a value the ORM passes to the database as it is can be a parameter
(an exact lookup of a text column, say): one it rewrites (``__contains``
wraps it in ``%``) is refused when compiled, as is a queryset that reads
related models or annotations. ``select_for_update`` keeps its rule: run
outside a transaction it raises as the ORM does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

from django.db import connections, models
from django.db.models import QuerySet
from django.db.models.query import ModelIterable, ValuesListIterable
from django.db.transaction import TransactionManagementError

from core.pipelined import Sent

M = TypeVar("M", bound=models.Model)

_MARK = "\x00llmgw-compiled-{}\x00"


class CompiledQuery(Generic[M]):
    """``build(*values)``'s queryset, compiled at its first run on each database and run with new values after.

    ``build`` takes the values the query filters on and returns a
    ``values_list()`` queryset (:meth:`rows` gives its tuples) or a plain
    model queryset (:meth:`instances`); it is called once per database, with
    markers, never with a caller's values.
    """

    def __init__(self, build: Callable[..., QuerySet]) -> None:
        self._build = build
        self._arity = build.__code__.co_argcount
        self._plans: dict[str, _Plan] = {}

    def rows(self, *values: Any, using: str = "default") -> list[tuple]:
        """The rows, as the ``values_list()`` queryset would give them."""
        plan = self._plan(using)
        if plan.model is not None:
            raise TypeError("this query reads model instances: call instances()")
        return plan.run(values, using)

    def instances(self, *values: Any, using: str = "default") -> list[M]:
        """The model instances, as iterating the queryset would give them."""
        plan = self._plan(using)
        if plan.model is None:
            raise TypeError("this query reads values_list() tuples: call rows()")
        names = plan.names
        return [plan.model.from_db(using, names, row) for row in plan.run(values, using)]

    def send(self, *values: Any, using: str = "default") -> Sent:
        """The ``values_list()`` query sent now, its rows read later (``core.pipelined.Sent``): one of a pipeline."""
        plan = self._plan(using)
        if plan.model is not None:
            raise TypeError("this query reads model instances: only a values_list() one is sent")
        return Sent.statement(plan.compiler, plan.sql, plan.params(values, using), using)

    def first(self, *values: Any, using: str = "default") -> M | None:
        """The first instance, or None: for a lookup by a unique column (no ORDER BY is added, as first() would)."""
        found = self.instances(*values, using=using)
        return found[0] if found else None

    def _plan(self, using: str) -> _Plan:
        plan = self._plans.get(using)
        if plan is None:
            plan = self._plans[using] = _Plan(self._build, self._arity, using)
        return plan


class _Plan:
    """One database's SQL for a compiled query, where each value goes, and how its columns are read."""

    def __init__(self, build: Callable[..., QuerySet], arity: int, using: str) -> None:
        self.arity = arity
        marks = [_MARK.format(i) for i in range(arity)]
        queryset = build(*marks)
        self.model: type[models.Model] | None = None
        self.names: list[str] = []
        if queryset._iterable_class is ModelIterable:
            if queryset.query.select_related or queryset.query.annotations or queryset.query.deferred_loading[0]:
                raise ValueError(
                    "a compiled query reads one model's own columns: no select_related, annotations or only()"
                )
            self.model = queryset.model
            self.names = [f.attname for f in queryset.model._meta.concrete_fields]
            queryset = queryset.values_list(*self.names)
        elif queryset._iterable_class is not ValuesListIterable:
            raise TypeError("a compiled query is a model queryset or a values_list() one")
        # The SQL is compiled on the caller's connection, as the queryset would be (inside its transaction:
        # FOR UPDATE is refused outside one). The compiler kept to read the rows is another, on a database
        # wrapper of its own that never connects: the plan outlives the thread that made it (a lane's lookup
        # runs on an executor thread), and a compiler keeps its connection, so the thread's would have stayed
        # open as long as the process. Nor may making a plan take a second connection: in a process whose
        # pool is full, two threads each holding one and waiting for another would wait for ever.
        self.sql, params = queryset.query.get_compiler(using=using).as_sql()
        self.compiler = queryset.query.get_compiler(connection=connections.create_connection(using))
        self.compiler.setup_query()
        fields = [s[0] for s in self.compiler.select[0 : self.compiler.col_count]]
        self.converters = self.compiler.get_converters(fields)
        # Each parameter: ("value", i) for the caller's i-th value, ("constant", v) for one the query fixes.
        self.slots: list[tuple[str, Any]] = []
        for param in params:
            if isinstance(param, str) and param in marks:
                self.slots.append(("value", marks.index(param)))
            elif isinstance(param, str) and "\x00llmgw-compiled-" in param:
                raise ValueError(f"the ORM rewrites a value of this query ({param!r}): it cannot be a parameter")
            else:
                self.slots.append(("constant", param))
        missing = set(range(arity)) - {i for kind, i in self.slots if kind == "value"}
        if missing:
            raise ValueError(f"values {sorted(missing)} never reach the SQL of this query")
        self.for_update = bool(queryset.query.select_for_update)

    def params(self, values: tuple, using: str) -> list[Any]:
        """The SQL's parameters for a call's values; refused as the ORM refuses the call."""
        if len(values) != self.arity:
            raise TypeError(f"this query takes {self.arity} values, not {len(values)}")
        connection = connections[using]
        if self.for_update and connection.features.has_select_for_update and connection.get_autocommit():
            raise TransactionManagementError("select_for_update cannot be used outside of a transaction.")
        return [values[v] if kind == "value" else v for kind, v in self.slots]

    def run(self, values: tuple, using: str) -> list[tuple]:
        params = self.params(values, using)
        connection = connections[using]
        with connection.cursor() as cursor:
            cursor.execute(self.sql, params)
            fetched = cursor.fetchall()
        if not self.converters:
            return [tuple(row) for row in fetched]
        return [tuple(row) for row in self.compiler.apply_converters(fetched, self.converters)]
