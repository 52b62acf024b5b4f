"""core.jsontext.compact: any JSON value json can write reads back as itself, ints past 64 bits included."""

from __future__ import annotations

import json

import orjson
from hypothesis import given
from hypothesis import strategies as st

from core.jsontext import compact

scalars = (
    st.none()
    | st.booleans()
    | st.integers()  # past 64 bits too: orjson refuses those, json writes them
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


@given(values)
def test_any_value_reads_back_as_itself(value):
    assert json.loads(compact(value)) == value


def test_an_int_past_64_bits_is_written_by_json_and_compactly():
    big = {"a": [1 << 64, -(1 << 70)]}
    try:
        orjson.dumps(big)
        raise AssertionError("orjson took an int past 64 bits: the fallback is no longer tested")
    except TypeError:
        pass
    assert compact(big) == b'{"a":[18446744073709551616,-1180591620717411303424]}'


def test_a_key_that_is_not_a_string_is_written_as_json_writes_it():
    assert json.loads(compact({1: "x"})) == {"1": "x"}


def test_the_common_case_is_orjson_s_text():
    body = {"ok": True, "next_report_s": 60, "load": 12.5}
    assert compact(body) == orjson.dumps(body)
