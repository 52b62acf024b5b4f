"""Rows with their JSON decoded once per distinct value: the same rows as values(), sharing what repeats."""

from __future__ import annotations

import pytest

from core.jsonrows import PerValue, values_decoded_once
from core.models import AuditEntry

pytestmark = pytest.mark.django_db

DETAILS = [{"a": 1, "b": [1, 2]}, {"b": [1, 2], "a": 1}, {"a": 2}, {}, {"s": 'é\n"x"', "n": None, "f": 1.5}]


def test_the_rows_are_the_ones_values_gives_and_a_repeated_value_is_decoded_once():
    for i, detail in enumerate(DETAILS):
        AuditEntry.record("t", f"a{i}", "x", detail)
    rows = AuditEntry.objects.order_by("pk")
    fields = ("pk", "action", "detail")
    read = list(values_decoded_once(rows, fields, ("detail",)))
    assert read == list(rows.values(*fields))
    assert read[0]["detail"] is read[1]["detail"], "the same value (keys in another order) is decoded once"
    assert read[2]["detail"] is not read[0]["detail"]


def test_a_value_shared_by_rows_is_converted_once_and_the_answer_is_the_conversions():
    calls = []

    def convert(value):
        calls.append(value)
        return frozenset(value or ())

    once = PerValue(convert)
    shared, equal_but_other = [1, 2], [1, 2]
    assert once(shared) == once(shared) == frozenset({1, 2}) and len(calls) == 1
    assert once(equal_but_other) == frozenset({1, 2}) and len(calls) == 2, "known by identity, not equality"
    assert once(None) == frozenset() and once([3]) == frozenset({3})
