"""The one JSON body reader every listener uses (core/jsonbody.py)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core import jsonbody

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=5), children, max_size=4),
    max_leaves=30,
)


@given(json_values)
def test_any_shallow_document_reads_back_as_itself(value):
    assert jsonbody.loads(json.dumps(value).encode()) == value


@pytest.mark.parametrize("levels", [65, 1_000, 100_000])
def test_a_body_nested_past_the_limit_is_refused_with_a_sentence(levels):
    with pytest.raises(jsonbody.BodyError, match="nested deeper than 64"):
        jsonbody.loads(b"[" * levels + b"]" * levels)
    with pytest.raises(jsonbody.BodyError, match="nested deeper than 64"):
        jsonbody.loads(b'{"a":' * levels + b"1" + b"}" * levels)


def test_the_limit_itself_is_accepted():
    assert jsonbody.depth(jsonbody.loads(b"[" * 64 + b"]" * 64)) == 64


def test_unclosed_deep_nesting_is_refused_not_crashed():
    with pytest.raises(jsonbody.BodyError):
        jsonbody.loads(b"[" * 200_000)


@pytest.mark.parametrize("raw", [b"\xff\xfe", b"{", b"", b"nul\x00"])
def test_what_is_not_json_says_so(raw):
    with pytest.raises(jsonbody.BodyError, match="the body is not"):
        jsonbody.loads(raw)


def test_many_brackets_that_are_not_deep_pass():
    wide = json.dumps([[i] for i in range(500)] + ["[[[[{{{{" * 20])
    assert len(jsonbody.loads(wide)) == 501


def _nesting(value) -> int:
    """The definition, recursively: a scalar 0, a container one more than its deepest child."""
    if isinstance(value, dict):
        return 1 + max(map(_nesting, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_nesting, value), default=0)
    return 0


NESTED = st.recursive(
    st.none() | st.integers() | st.text(max_size=3),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=3), inner, max_size=4),
    max_leaves=60,
)


@given(NESTED, st.integers(0, 8))
def test_depth_is_the_nesting_and_stops_just_past_the_limit(value, stop_past):
    nesting = _nesting(value)
    assert jsonbody.depth(value) == nesting
    assert jsonbody.depth(value, stop_past) == (nesting if nesting <= stop_past else stop_past + 1)


def test_depth_of_a_value_that_holds_itself_stops_past_the_limit():
    loop: list = []
    loop.append(loop)
    assert jsonbody.depth(loop, 10) == 11
