"""report_schema.unstorable words core.storable's problems (tests/core/test_storable.py holds the rule itself)."""

from __future__ import annotations

from inventory import report_schema as S


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
