"""What a column can hold, read from the Django model field itself: the one home of column limits.

A request body's fields (``api.columns``) and an agent's report
(``inventory.bounds``, for ``inventory.report_schema``) are both checked
against the columns they land in, and both read the limits here: a
``CharField``'s ``max_length``, and the range the database in use gives an
integer field's type. Narrowing or widening a column in a migration changes
what both accept at once, with no second number to forget.
"""

from __future__ import annotations

from django.db import connection, models

Limit = int | tuple[int, int]
"""A text column's most characters, or an integer column's (lowest, highest), as inventory.report_schema takes it."""

WIDEST_INTEGER = (-(2**63), 2**63 - 1)
"""What a 64-bit integer column holds: an end the database leaves open is read as this one's."""


def field(model: type[models.Model], name: str) -> models.Field:
    """The model field behind a column, by the field's name."""
    return model._meta.get_field(name)


def max_length(column: models.Field) -> int | None:
    """The most characters a text column holds; None where it is not text or has no limit."""
    if isinstance(column, models.CharField) and column.max_length:
        return column.max_length
    return None


def integer_range(column: models.Field) -> tuple[int | None, int | None]:
    """The range the database holds for ``column``'s integer type, e.g. (0, 2**63 - 1); None at an open end."""
    return connection.ops.integer_field_range(column.get_internal_type())


def limit(column: models.Field) -> Limit | None:
    """What one column holds: its length, or its integer range with both ends closed; None for anything else."""
    length = max_length(column)
    if length is not None:
        return length
    if isinstance(column, models.IntegerField):  # every integer field, small to big, positive or not
        low, high = integer_range(column)
        return (low if low is not None else WIDEST_INTEGER[0], high if high is not None else WIDEST_INTEGER[1])
    return None


def field_limit(model: type[models.Model], name: str) -> Limit | None:
    """``limit`` of a model's field, by name."""
    return limit(field(model, name))


def narrowest(limits: list[Limit]) -> Limit:
    """The limit every one of several columns can hold: the shortest length, or the tightest range."""
    if all(isinstance(x, int) for x in limits):
        return min(limits)  # type: ignore[type-var]
    ranges = [x for x in limits if isinstance(x, tuple)]
    return (max(low for low, _ in ranges), min(high for _, high in ranges))
