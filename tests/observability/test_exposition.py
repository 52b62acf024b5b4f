"""The fast text writer is prometheus_client's own output, byte for byte, whatever the families hold."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)

from observability import exposition


class Families:
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families


def library(families: list[Metric]) -> bytes:
    return generate_latest(Families(families))


FIRST, REST = "abcxyzABZ_:", "abcxyzABZ019_:"
legacy_name = st.builds(lambda a, b: a + b, st.sampled_from(FIRST), st.text(alphabet=REST, max_size=10))
# Mostly names the fast path takes, sometimes one the library has to escape (a dot, a dash, a non-ASCII letter).
metric_name = st.one_of(legacy_name, legacy_name.map(lambda n: n + ".x"), st.just("llmgw_été"))
label_name = st.one_of(
    st.builds(lambda a, b: a + b, st.sampled_from("abnzAZ"), st.text(alphabet="abnzAZ09_", max_size=6)),
    st.just("le"),
    st.just("gpu-index"),
    st.just("é"),
)
label_value = st.one_of(
    st.text(max_size=12),
    st.sampled_from(['a"b', "back\\slash", "new\nline", "\\n", "", "é", "gb200-nvl72-00-tray-03"]),
)
value = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 1.0, 1, 0, True, 1e21, 12345678.9, 5e-324]),
    st.integers(min_value=-(2**63), max_value=2**63),
)


@st.composite
def gauge(draw: st.DrawFn) -> Metric:
    names = draw(st.lists(label_name, max_size=4, unique=True))
    family = GaugeMetricFamily(
        draw(metric_name), draw(st.text(max_size=30)), labels=names if names or draw(st.booleans()) else None
    )
    for _ in range(draw(st.integers(0, 6))):
        family.add_metric([draw(label_value) for _ in names], draw(value))
    return family


@st.composite
def other(draw: st.DrawFn) -> Metric:
    kind = draw(st.sampled_from(["counter", "histogram", "info"]))
    name = draw(legacy_name)
    if kind == "counter":
        family = CounterMetricFamily(name, "a counter", labels=["node"])
        family.add_metric([draw(label_value)], abs(draw(st.floats(allow_nan=False, allow_infinity=False))))
        return family
    if kind == "histogram":
        family = HistogramMetricFamily(name, "a histogram")
        family.add_metric([], [("0.5", 1.0), ("+Inf", 2.0)], 3.0)
        return family
    family = InfoMetricFamily(name, "an info", labels=["node"])
    family.add_metric([draw(label_value)], {"version": draw(label_value)})
    return family


@settings(max_examples=400)
@given(st.lists(st.one_of(gauge(), other()), max_size=5))
def test_any_families_are_written_as_the_library_writes_them(families: list[Metric]) -> None:
    assert exposition.text(families) == library(families)


def test_a_negative_zero_after_a_zero_keeps_its_sign() -> None:
    family = GaugeMetricFamily("g", "zeros", labels=["n"])
    for n, v in (("a", 0.0), ("b", -0.0), ("c", 0), ("d", math.nan), ("e", math.nan)):
        family.add_metric([n], v)
    written = exposition.text([family])
    assert b'g{n="b"} -0.0\n' in written
    assert written == library([family])


def test_a_gauge_with_a_timestamp_is_left_to_the_library() -> None:
    family = GaugeMetricFamily("g", "stamped", labels=["n"])
    family.add_metric(["a"], 1.0, timestamp=1700000000.5)
    assert (
        exposition.text([family])
        == library([family])
        == b'# HELP g stamped\n# TYPE g gauge\ng{n="a"} 1.0 1700000000500\n'
    )
