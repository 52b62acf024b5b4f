"""Column limits have one reading (core.columns), which the API's body checks and the report schema share."""

from __future__ import annotations

import pytest

from api import columns as api_columns
from api.base import Refused
from core import columns
from gateway.models import Budget, Team
from inventory.models import GPU, IBPort


def test_a_text_column_holds_its_max_length_and_an_integer_column_its_range_here():
    assert columns.field_limit(GPU, "uuid") == GPU._meta.get_field("uuid").max_length
    assert columns.field_limit(IBPort, "port") == (0, 32767), "PositiveSmallIntegerField"
    assert columns.max_length(columns.field(IBPort, "port")) is None
    assert columns.field_limit(GPU, "memory_mb")[1] == 2**63 - 1


def test_the_api_and_the_reports_read_a_column_alike(monkeypatch):
    name = columns.field(Team, "name")
    monkeypatch.setattr(name, "max_length", 5)
    assert columns.field_limit(Team, "name") == 5
    assert api_columns.text("abcde", "team", name) == "abcde"
    with pytest.raises(Refused, match="team is 6 characters; at most 5 fit"):
        api_columns.text("abcdef", "team", name)
    low, high = columns.integer_range(columns.field(Budget, "amount_micros"))
    assert columns.field_limit(Budget, "amount_micros") == (low, high)
    with pytest.raises(Refused, match=f"from {low} to {high}"):
        api_columns.whole(high + 1, "amount_micros", columns.field(Budget, "amount_micros"))


def test_several_columns_hold_the_narrowest_of_their_limits():
    assert columns.narrowest([32, 64]) == 32
    assert columns.narrowest([(0, 100), (-5, 50)]) == (0, 50)
