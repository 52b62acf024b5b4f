"""The one JSON body reader every listener uses (core/jsonbody.py)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
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


def _same(a, b) -> bool:
    """Equal, of the same types and in the same key order all the way down (1e30 is not 10**30, -0.0 not 0.0)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float):
        return repr(a) == repr(b)  # NaN is itself, -0.0 is not 0.0
    return a == b


def _json_reads(text: str):
    """json's answer to ``text``: ("value", v), or ("refused", None)."""
    try:
        return "value", json.loads(text)
    except (ValueError, RecursionError):
        return "refused", None


documents = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=2**62, max_value=2**80)
    | st.integers(min_value=-(2**80), max_value=-(2**62))
    | st.floats()  # NaN and infinity too: json writes them as NaN and Infinity, which it also reads
    | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=5), children, max_size=4),
    max_leaves=30,
)


@given(documents, st.sampled_from([None, 0, 2]), st.booleans())
def test_a_document_is_read_as_json_reads_it_whoever_reads_it(value, indent, ascii_only):
    """orjson reads the common body; where it would differ (an int past 64 bits, NaN), json reads it."""
    text = json.dumps(value, indent=indent, ensure_ascii=ascii_only)
    kind, expected = _json_reads(text)
    assert kind == "value"
    assert _same(jsonbody.loads(text.encode()), expected)


# Texts from JSON's own characters, and a few others: mostly invalid, sometimes valid, now and then
# something only one of the two readers takes.
json_texts = st.text(alphabet=[*'{}[]",:0123456789.eE+- truefalsnNIiyx\t\n\r\\/u', "é", "\x00", "\u2028"])


@settings(max_examples=1000)
@given(json_texts)
def test_whatever_orjson_reads_json_reads_the_same(text):
    fast = jsonbody._read_fast(text, text.encode("utf-8", "surrogatepass"))
    kind, expected = _json_reads(text)
    if fast is not jsonbody._NOT_READ:
        assert kind == "value" and _same(fast, expected), (text, fast, expected)
    try:
        read = jsonbody.loads(text.encode())
    except jsonbody.BodyError:
        assert kind == "refused" or jsonbody.depth(expected) > jsonbody.MAX_DEPTH
    else:
        assert kind == "value" and _same(read, expected)


@pytest.mark.parametrize(
    "text",
    [
        "18446744073709551616",  # 2**64: orjson reads a float
        "-9223372036854775809",
        "123456789012345678901234567890",
        "[NaN, Infinity, -Infinity]",
        "1e400",
        '"\\ud800"',
        '{"a": 1, "a": 2}',
        "-0",
        "-0.0",
        "5e-324",
        '"\\ud83d\\ude00"',
    ],
)
def test_where_the_readers_part_json_s_value_is_the_answer(text):
    assert _same(jsonbody.loads(text.encode()), json.loads(text))


# Text that may hold a lone surrogate, an escaped pair, or both, in keys and values.
maybe_unpaired = st.text(alphabet=st.sampled_from(["a", "é", "\ud800", "\udfff", "\U0001f600"]), max_size=4)
unpaired_values = st.recursive(
    st.none() | st.integers() | maybe_unpaired,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(maybe_unpaired, children, max_size=3),
    max_leaves=12,
)


def holds_a_lone_surrogate(raw: bytes) -> bool:
    # What json reads back (two escaped halves next to each other are one character) cannot be UTF-8.
    try:
        json.dumps(json.loads(raw), ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


@settings(max_examples=300, deadline=None)
@given(unpaired_values)
def test_unicode_only_refuses_exactly_the_bodies_with_a_lone_surrogate(value):
    raw = json.dumps(value).encode()  # on the wire a surrogate is an escape: its own bytes are not UTF-8
    if holds_a_lone_surrogate(raw):
        with pytest.raises(jsonbody.BodyError, match="lone surrogate"):
            jsonbody.loads(raw, unicode_only=True)
        jsonbody.loads(raw)  # still read without the option: the admin API and the agents' name it themselves
    else:
        assert jsonbody.loads(raw, unicode_only=True) == json.loads(raw)


@pytest.mark.parametrize("escapes", ["\\ud800\\u0000", "\\u0000\\udfff", "x\\ud800\\u0000y"])
def test_a_lone_surrogate_beside_a_nul_is_still_refused(escapes):
    """Found by tests/gateway/test_lone_surrogates.py: a NUL in the same string hid the surrogate from the check."""
    with pytest.raises(jsonbody.BodyError, match="lone surrogate"):
        jsonbody.loads(('{"model": "' + escapes + '"}').encode(), unicode_only=True)
