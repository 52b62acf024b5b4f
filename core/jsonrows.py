"""Rows of a queryset with their JSON columns decoded once per distinct value, not once per row.

A fleet's cards repeat themselves: card 3 of every HGX box has the same
nearest adapters, and a healthy card's ECC counters are the same zeros as
every other healthy card's. Decoding each row's JSON (Django's JSONField
calls ``json.loads`` per row) was most of the time of the reads that walk
every card of a large fleet; here the column is read as its text and each
distinct text decoded once.

The rows then share their decoded values: callers must read them, never
change them in place.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Generic, TypeVar

from django.db.models import QuerySet, TextField
from django.db.models.functions import Cast

T = TypeVar("T")

_TEXT = "_json_text_of_"
_UNSEEN = object()


def values_decoded_once(rows: QuerySet, fields: Sequence[str], json_fields: Sequence[str]) -> Iterator[dict[str, Any]]:
    """``rows.values(*fields)`` as dicts, the ``json_fields`` among them decoded once per distinct text.

    The same values as ``values()`` gives: PostgreSQL's text of a ``jsonb``
    is what Django decodes, and SQL NULL is None.
    """
    texts = [f for f in fields if f in json_fields]
    decode = DecodedOnce()
    for row in values_list_as_text(rows, fields, json_fields):
        out = dict(zip(fields, row, strict=True))
        for field in texts:
            out[field] = decode(out[field])
        yield out


def values_list_as_text(rows: QuerySet, fields: Sequence[str], json_fields: Sequence[str]) -> QuerySet:
    """``rows.values_list(*fields)`` with the ``json_fields`` among them as their text, not decoded.

    For a reader that keys on a row before it decodes anything (rows that
    repeat are worked out once): :class:`DecodedOnce` decodes the texts as
    ``values()`` would have.
    """
    texts = {f: Cast(f, TextField()) for f in fields if f in json_fields}
    return rows.annotate(**{_TEXT + f: cast for f, cast in texts.items()}).values_list(
        *(_TEXT + f if f in texts else f for f in fields)
    )


class DecodedOnce:
    """A JSON column's text decoded as Django's JSONField decodes it, once per distinct text; None stays None.

    The values decoded are shared by every row with that text: read them, never change them.
    """

    def __init__(self) -> None:
        self._decoded: dict[str, Any] = {}

    def __call__(self, text: str | None) -> Any:
        if text is None:
            return None
        value = self._decoded.get(text, _UNSEEN)
        if value is _UNSEEN:
            value = self._decoded[text] = json.loads(text)
        return value


class PerValue(Generic[T]):
    """``convert(value)`` computed once per decoded value that ``values_decoded_once`` shares among its rows.

    Those rows hold one object per distinct JSON text, so what is derived from
    it (a frozenset of a card's peers, say) can be derived once per object,
    not once per row. An object is known by its identity, and kept while this
    is, so its identity is never another's; so the values converted must not
    change. A value met for the first time is converted; the answer is always
    ``convert(value)``'s.
    """

    def __init__(self, convert: Callable[[Any], T]) -> None:
        self._convert = convert
        self._seen: dict[int, tuple[Any, T]] = {}

    def __call__(self, value: Any) -> T:
        seen = self._seen.get(id(value))
        if seen is None:
            # The value is kept beside its answer: while it lives, no other object can take its id.
            seen = self._seen[id(value)] = (value, self._convert(value))
        return seen[1]
