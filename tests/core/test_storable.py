"""core.storable: the fast check lets through nothing the walk refuses; the walk finds each kind, key or value."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core import storable

# Strings that may hold a NUL, a lone surrogate, or the six characters the encoder spells a NUL with.
texts = st.one_of(st.text(max_size=8), st.sampled_from(["\x00", "a\x00b", "\ud800", "x\udfff", "\\u0000", "é"]))
scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True, allow_infinity=True), texts)
documents = st.recursive(
    scalars,
    lambda children: st.one_of(st.lists(children, max_size=4), st.dictionaries(texts, children, max_size=4)),
    max_leaves=20,
)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])  # a shared CI core
@given(documents)
def test_the_fast_check_finds_what_the_walk_finds(value):
    walked = list(storable.problems(value, "doc", fast=False))
    assert list(storable.problems(value, "doc")) == walked
    assert not (walked and storable.plainly_storable(value))


def test_each_kind_is_found_with_its_path():
    found = list(
        storable.problems({"a": ["ok", "x\x00"], "b\ud800": 1, "c": {"d": float("inf")}, "e": float("nan")}, "doc")
    )
    assert sorted((p.path, p.kind, p.key) for p in found) == [
        ("doc", storable.SURROGATE, True),
        ("doc.a[1]", storable.NUL, False),
        ("doc.c.d", storable.NOT_FINITE, False),
        ("doc.e", storable.NOT_FINITE, False),
    ]


def test_plain_values_are_storable_at_once():
    assert storable.plainly_storable({"gpus": [{"index": 0, "uuid": "GPU-1", "health": [], "memory": None}]})
    assert not list(storable.problems({"name": "é\u2028", "n": 10**30, "f": 1e308, "nothing": None}, "doc"))


def test_a_deep_value_is_walked_without_recursion():
    deep: list = ["\x00"]
    for _ in range(100_000):
        deep = [deep]
    assert [p.kind for p in storable.problems(deep, "doc")] == [storable.NUL]


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(documents)
def test_every_path_a_problem_names_can_itself_be_stored(value):
    # A refusal quotes the path: a key holding a NUL or a lone surrogate, with a problem beneath it, must not
    # carry that character into the words (a node's report_error column, a JSON answer orjson writes).
    for problem in storable.problems(value, "doc"):
        assert storable.text_problem(problem.path) is None, problem
        assert problem.path.encode("utf-8")


def test_a_bad_key_is_named_in_the_path_beneath_it_by_its_escape():
    found = list(storable.problems({"b\ud800": {"c\x00": "\x00"}}, "doc"))
    paths = sorted(p.path for p in found)
    assert paths == ["doc", "doc.b\\ud800", "doc.b\\ud800.c\\x00"]
