"""Rows with their JSON decoded once per distinct value: the same rows as values(), sharing what repeats."""

from __future__ import annotations

import pytest

from core.jsonrows import values_decoded_once
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
