"""The mutant engine itself: each shape walked once, one place changed per mutant, the original untouched."""

from __future__ import annotations

import copy

from tests.hostile import mutants as M

DOC = {
    "gpus": [
        {"index": 0, "name": "a", "nics": {"mlx5_0": "PIX"}},
        {"index": 1, "name": "b", "nics": {"mlx5_1": "SYS"}},
    ],
    "host": {"memory_mb": 10, "flags": []},
}


def differences(a, b, path=()) -> list[tuple]:
    if type(a) is not type(b):
        return [path]
    if not isinstance(a, dict | list):
        return [] if a == b else [path]
    if isinstance(a, dict):
        if set(a) != set(b):
            return [path]
        return [d for k in a for d in differences(a[k], b[k], (*path, k))]
    if len(a) != len(b):
        return [path]
    return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in differences(x, y, (*path, i))]


def test_each_shape_is_walked_once_at_its_first_place():
    original = copy.deepcopy(DOC)
    cases = list(M.cases(DOC, maps=frozenset({"nics"})))
    assert original == DOC
    walked = {M.shape(c.path, frozenset({"nics"})) for c in cases}
    assert walked == {
        ".gpus",
        ".gpus[*]",
        ".gpus[*].index",
        ".gpus[*].name",
        ".gpus[*].nics",
        ".gpus[*].nics.{}",
        ".host",
        ".host.memory_mb",
        ".host.flags",
    }
    assert all(c.path[:2] != ("gpus", 1) for c in cases)


def test_every_mutant_changes_exactly_its_own_place():
    for case in M.cases(DOC, maps=frozenset({"nics"})):
        changed = differences(DOC, case.doc)
        if case.mutant.name.startswith("key:"):
            assert changed == [case.path[:-1]], case
        else:
            assert changed == [case.path] or (case.mutant.value is M.DELETE and changed == [case.path[:-1]]), case


def test_a_number_gets_the_numeric_extremes_and_every_other_type():
    mine = [c for c in M.cases(DOC) if c.path == ("host", "memory_mb") and c.mutant.value is not M.DELETE]
    names = {c.mutant.name: c.doc["host"]["memory_mb"] for c in mine}
    assert names["2**63"] == 2**63 and names["-1"] == -1 and names["10**30"] == 10**30
    assert names["NUL string"] == "a\x00b" and names["wrong type: null"] is None
    deleted = next(c for c in M.cases(DOC) if c.path == ("host", "memory_mb") and c.mutant.value is M.DELETE)
    assert "memory_mb" not in deleted.doc["host"]


def test_the_other_documents_value_is_a_mutant_where_it_differs():
    theirs = copy.deepcopy(DOC)
    theirs["gpus"][0]["name"] = "theirs"
    foreign = [c for c in M.cases(DOC, foreign=theirs) if c.mutant.name.startswith("the other node's")]
    assert [(c.path, c.doc["gpus"][0]["name"]) for c in foreign] == [(("gpus", 0, "name"), "theirs")]


def test_deep_nests_past_the_readers_limit():
    depth, value = 0, M.deep()
    while isinstance(value, list) and value:
        depth, value = depth + 1, value[0]
    assert depth + 1 == M.DEEP_LEVELS > 64
