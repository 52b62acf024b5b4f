"""agent.protocol.stable_text (what a report's digest is of) is json's text, byte for byte, whoever writes it."""

from __future__ import annotations

import dataclasses
import json
import uuid
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

from hypothesis import given, settings
from hypothesis import strategies as st

from agent.protocol import report_digest, stable_text

TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=8) | st.sampled_from(
    [
        *["\x00", "\x1f", "\x7f", "\u2028", "é", "\\", '"', "/", "\n\t\r\b\f", "null", "0.0000"],
        *["GPU-b704-161e-5ebe", "a:1e-5", "[2e-7]", "1e-7", ",3.5e-8x", "9e-10"],
    ]
)
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(-(2**63), 2**64)
    | st.floats()
    | st.sampled_from([1e-5, 9.99e-5, -1.5e-7, 1e-4, 1e16, 1e-10, -0.0])
    | TEXT
)
VALUES = st.recursive(
    SCALARS, lambda inner: st.lists(inner, max_size=5) | st.dictionaries(TEXT, inner, max_size=5), max_leaves=40
)


def json_text(value) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str).encode()


@settings(max_examples=2000)
@given(VALUES)
def test_any_json_value_is_written_as_json_writes_it(value):
    assert stable_text(value) == json_text(value)


@dataclasses.dataclass
class Reading:
    value: int


def test_what_json_hands_to_str_is_written_as_json_writes_it():
    values = [
        {"at": datetime(2026, 12, 7, 1, 2, 3, tzinfo=UTC), "day": date(2026, 12, 7), "took": timedelta(seconds=3)},
        {"id": uuid.UUID(int=5), "price": Decimal("1.50"), "tags": {"a"}, "raw": b"x", "reading": Reading(3)},
        {"b": 1, "a": {"d": [1, 2.5, None], "c": "x"}},
        {1: "int keys", 2: "sorted as ints"},
    ]
    for value in values:
        assert stable_text(value) == json_text(value), value


def test_a_report_s_digest_is_the_one_json_gave():
    report = {"schema": 1, "hostname": "hgx-000", "gpus": [{"index": 0, "uuid": "GPU-1", "temperature_c": 40}]}
    stable = {"schema": 1, "hostname": "hgx-000", "gpus": [{"index": 0, "uuid": "GPU-1"}]}
    import hashlib

    assert report_digest(report) == hashlib.sha256(json_text(stable)).hexdigest()
