"""Every test the docs name as the proof of a promise exists, so a promise cannot outlive its test."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NAMED = re.compile(r"`(tests/[\w/]+(?:\.py)?/?)(?:::(\w+))?`")


def named_tests() -> list[tuple[str, str, str | None]]:
    found = []
    for doc in sorted([*ROOT.glob("docs/*.md"), ROOT / "README.md"]):
        for path, name in NAMED.findall(doc.read_text()):
            found.append((doc.name, path, name or None))
    return found


def test_the_docs_name_their_proofs():
    assert len(named_tests()) >= 40


@pytest.mark.parametrize(("doc", "path", "name"), named_tests())
def test_every_test_a_doc_names_exists(doc, path, name):
    target = ROOT / path
    assert target.exists(), f"{doc} names {path}, which does not exist"
    if name:
        assert re.search(rf"^(async )?def {name}\(", target.read_text(), re.M), f"{doc} names {path}::{name}"
