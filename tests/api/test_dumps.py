"""api.base.dumps (orjson) writes what DRF's encoder writes, or where it cannot, the same value another way."""

from __future__ import annotations

import enum
import json
import math
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from uuid import UUID

import pytest
from hypothesis import given
from hypothesis import strategies as st

from api.base import _ENCODER, dumps

# Every float json and orjson write alike: all but those between 1e-9 and 1e-4 in size.
ALIKE_FLOATS = st.floats(allow_nan=False, allow_infinity=False).filter(lambda f: not 1e-9 <= abs(f) < 1e-4)
SCALARS = st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | ALIKE_FLOATS | st.text()
JSONISH = st.recursive(
    SCALARS, lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(), inner, max_size=5), max_leaves=40
)


@given(JSONISH)
def test_a_json_value_is_written_byte_for_byte_as_drf_writes_it(value):
    assert dumps(value) == _ENCODER.encode(value)


@given(st.floats(allow_nan=False, allow_infinity=False))
def test_any_finite_float_reads_back_as_itself(value):
    assert json.loads(dumps(value)) == value
    assert json.loads(dumps(value)) == json.loads(_ENCODER.encode(value))


def test_nan_and_infinity_are_null_which_a_strict_parser_reads():
    text = dumps({"a": math.nan, "b": math.inf, "c": -math.inf})
    assert text == '{"a":null,"b":null,"c":null}'
    json.loads(text, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))


@given(st.integers() | st.integers(min_value=2**64) | st.integers(max_value=-(2**63) - 1))
def test_an_int_of_any_size_is_written_as_drf_writes_it(value):
    assert dumps({"n": [value]}) == _ENCODER.encode({"n": [value]})


class Colour(enum.Enum):
    RED = "red"


class Level(enum.IntEnum):
    HIGH = 3


class Name(enum.StrEnum):
    A = "a"


def test_what_only_drf_knows_is_written_as_drf_writes_it():
    values = [
        {1: "int key", None: "none key"},
        {"at": datetime(2026, 12, 7, 1, 2, 3, 456789, tzinfo=UTC)},
        {"at": datetime(2026, 12, 7, 1, 2, 3, tzinfo=timezone(timedelta(hours=2)))},
        {"naive": datetime(2026, 12, 7, 1, 2, 3)},
        {"took": timedelta(seconds=90)},
        {"price": Decimal("1.25")},
        {"id": UUID(int=7)},
        {"level": Level.HIGH, "name": Name.A},
        {"tuple": (1, 2), "set": []},
    ]
    for value in values:
        assert dumps(value) == _ENCODER.encode(value), value
    assert dumps({"at": datetime(2026, 1, 1, tzinfo=UTC)}) == '{"at":"2026-01-01T00:00:00Z"}'


def test_a_plain_enum_is_its_value_where_drf_refuses_it_and_anything_else_is_refused():
    with pytest.raises(TypeError):
        _ENCODER.encode({"c": Colour.RED})
    assert dumps({"c": Colour.RED}) == '{"c":"red"}'
    with pytest.raises(TypeError):
        dumps({"c": object()})
