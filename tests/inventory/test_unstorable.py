"""report_schema.unstorable's fast path (one encoding) never lets through what the walk would refuse."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inventory import report_schema as S

# Strings that may hold a NUL, a lone surrogate, or the six characters the encoder spells a NUL with.
texts = st.one_of(st.text(max_size=8), st.sampled_from(["\x00", "a\x00b", "\ud800", "x\udfff", "\\u0000", "é"]))
scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True, allow_infinity=True), texts)
documents = st.recursive(
    scalars,
    lambda children: st.one_of(st.lists(children, max_size=4), st.dictionaries(texts, children, max_size=4)),
    max_leaves=20,
)


def walked(value) -> list[str]:
    """What the walk alone finds, the fast path left out."""
    out: list[str] = []
    real, S._plainly_storable = S._plainly_storable, lambda _value: False
    try:
        S.unstorable(value, "report", out)
    finally:
        S._plainly_storable = real
    return out


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])  # a shared CI core
@given(documents)
def test_the_fast_path_finds_what_the_walk_finds(value):
    out: list[str] = []
    S.unstorable(value, "report", out)
    assert out == walked(value)


def test_each_kind_of_unstorable_value_is_still_named():
    for value, words in [
        ({"a": "x\x00"}, "holds a NUL"),
        ({"a\x00": 1}, "a key"),
        ({"a": ["\ud800"]}, "lone surrogate"),
        ({"a": float("nan")}, "not a number"),
    ]:
        out: list[str] = []
        S.unstorable(value, "report", out)
        assert out and words in out[0], (value, out)
    assert S._plainly_storable({"gpus": [{"index": 0, "uuid": "GPU-1", "health": []}]})
