"""Mutants of a JSON document: every leaf (and every inner object or list) replaced by a hostile value.

Pure: documents in, documents out. A *path* is a tuple of dict keys and list
indices; its *shape* is the path with list indices written ``*`` and the keys
of free-form maps (adapter names, counter names) written ``{}``, so the eight
GPUs of a report are one shape, walked once.

Each mutant is named, so a failure says what was sent: "NUL string",
"2**63", "deleted" …
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

Path = tuple[str | int, ...]
DELETE = object()  # the mutant that removes the key (or the list item) instead of replacing it

LONG = "x" * 10_000
DEEP_LEVELS = 100  # deeper than any JSON reader of llmgw accepts (64)


def deep(levels: int = DEEP_LEVELS) -> list:
    value: list = []
    for _ in range(levels - 1):
        value = [value]
    return value


@dataclass(frozen=True)
class Mutant:
    """One hostile value for one place in a document."""

    name: str
    value: Any

    def __str__(self) -> str:
        return self.name


NUL = Mutant("NUL string", "a\x00b")
LONG_TEXT = Mutant("long string (10,000 chars)", LONG)
HUGE = Mutant("2**63", 2**63)
DEEP = Mutant("nested 100 deep", deep())
GONE = Mutant("deleted", DELETE)
# By the type of the value replaced: each type's own extremes, then the other types
# (a NUL string stands for "a string", 2**63 for "an integer": the wrong type at its worst).
BY_TYPE: dict[str, tuple[Mutant, ...]] = {
    "str": (
        LONG_TEXT,
        NUL,
        Mutant('empty ""', ""),
        HUGE,
        Mutant("wrong type: list", ["hostile"]),
        Mutant("wrong type: dict", {"hostile": "x"}),
        Mutant("wrong type: null", None),
        Mutant("wrong type: bool", True),
        DEEP,
        GONE,
    ),
    "number": (
        HUGE,
        Mutant("2**31", 2**31),
        Mutant("10**30", 10**30),
        Mutant("-1", -1),
        Mutant("wrong type: float", 1.5),
        Mutant("wrong type: int", 7),
        NUL,
        Mutant("empty []", []),
        Mutant("empty {}", {}),
        Mutant("wrong type: null", None),
        Mutant("wrong type: bool", True),
        DEEP,
        GONE,
    ),
    "bool": (
        Mutant("wrong type: int", 1),
        HUGE,
        NUL,
        Mutant("empty []", []),
        Mutant("empty {}", {}),
        Mutant("wrong type: null", None),
        DEEP,
        GONE,
    ),
    "null": (LONG_TEXT, NUL, HUGE, Mutant("-1", -1), Mutant("empty []", []), Mutant("empty {}", {}), DEEP, GONE),
    # An empty list or object: filled with hostile items, or replaced.
    "list": (
        Mutant("item: NUL string", ["a\x00b"]),
        Mutant("item: long string (10,000 chars)", [LONG]),
        Mutant("item: 2**63", [2**63]),
        Mutant("item: {}", [{}]),
        NUL,
        Mutant("wrong type: dict", {"hostile": "x"}),
        Mutant("wrong type: null", None),
        DEEP,
        GONE,
    ),
    "dict": (
        Mutant("entry: NUL key and value", {"a\x00b": "a\x00b"}),
        Mutant("entry: long key and value", {LONG: LONG}),
        Mutant("entry: 2**63", {"hostile": 2**63}),
        NUL,
        Mutant("wrong type: list", ["hostile"]),
        Mutant("wrong type: null", None),
        DEEP,
        GONE,
    ),
}


def kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "str"
    return "list" if isinstance(value, list) else "dict"


def for_leaf(value: Any) -> tuple[Mutant, ...]:
    return BY_TYPE[kind(value)]


# The most dangerous few, for leaves walked in bulk (a report inside a registration).
CORE = (
    Mutant("long string (10,000 chars)", LONG),
    Mutant("NUL string", "a\x00b"),
    Mutant("2**63", 2**63),
    Mutant("-1", -1),
    Mutant("wrong type: str", "hostile"),
    Mutant("wrong type: int", 7),
    Mutant("wrong type: null", None),
    Mutant("deleted", DELETE),
)
# An object or a list in the place of another thing, emptied, or gone.
INNER = (
    NUL,
    HUGE,
    Mutant("wrong type: null", None),
    Mutant("wrong type: bool", False),
    Mutant("wrong type: list", ["hostile"]),
    Mutant("wrong type: dict", {"hostile": "x"}),
    Mutant("empty []", []),
    Mutant("empty {}", {}),
    DEEP,
    GONE,
)
# A free-form map's key renamed.
KEYS = (
    Mutant("key: long string (10,000 chars)", LONG),
    Mutant("key: NUL string", "a\x00b"),
    Mutant('key: empty ""', ""),
)
# For path parameters (a name in the URL) and header values.
PATH_TEXT = (
    Mutant("long string (10,000 chars)", LONG),
    Mutant("NUL string", "a\x00b"),
    Mutant("2**63", str(2**63)),
    Mutant("-1", "-1"),
    Mutant("non-ASCII", "ñ☃\U0001f600"),
)


def fmt(path: Path) -> str:
    """A path as a reader writes it: ``gpus[0].fabric.clique_id``."""
    out = ""
    for step in path:
        out += f"[{step}]" if isinstance(step, int) else (f".{step}" if out else step)
    return out or "(the body)"


def shape(path: Path, maps: frozenset[str] = frozenset()) -> str:
    """The path with list indices as ``*`` and keys of free-form maps as ``{}``."""
    out, parent = "", None
    for step in path:
        if isinstance(step, int):
            out += "[*]"
        elif parent in maps:
            out += ".{}"
        else:
            out += f".{step}"
        parent = step if isinstance(step, str) else parent
    return out


def walk(doc: Any, path: Path = ()) -> Iterator[tuple[Path, Any]]:
    """Every place in a document, parents before children, the root left out."""
    if path:
        yield path, doc
    if isinstance(doc, dict):
        for key, value in doc.items():
            yield from walk(value, (*path, key))
    elif isinstance(doc, list):
        for i, value in enumerate(doc):
            yield from walk(value, (*path, i))


def get(doc: Any, path: Path) -> Any:
    for step in path:
        doc = doc[step]
    return doc


def mutate(doc: Any, path: Path, value: Any) -> Any:
    """A copy of ``doc`` with the value at ``path`` replaced (or removed, for DELETE)."""
    out = copy.deepcopy(doc)
    parent = get(out, path[:-1])
    if value is DELETE:
        del parent[path[-1]]
    else:
        parent[path[-1]] = copy.deepcopy(value)
    return out


def rename_key(doc: Any, path: Path, key: str) -> Any:
    """A copy of ``doc`` with the key at the end of ``path`` renamed, its value kept."""
    out = copy.deepcopy(doc)
    parent = get(out, path[:-1])
    parent[key] = parent.pop(path[-1])
    return out


def same(a: Any, b: Any) -> bool:
    """Equal as JSON, type included (True is not 1, 1.0 is not 1)."""
    return type(a) is type(b) and json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


@dataclass(frozen=True)
class Case:
    """One mutated document, and what was done to make it."""

    path: Path
    mutant: Mutant
    doc: Any

    @property
    def where(self) -> str:
        return fmt(self.path)


def cases(
    doc: Any,
    *,
    leaf: Iterable[Mutant] | None = None,
    inner: Iterable[Mutant] = INNER,
    maps: frozenset[str] = frozenset(),
    foreign: Any = None,
    seen: set[str] | None = None,
    core_under: tuple[str, ...] = (),
) -> Iterator[Case]:
    """Every mutant of every shape of ``doc``, each shape walked at its first place only.

    ``foreign``: another node's document of the same kind; where it holds a
    different value at the same path, that value is a mutant too ("B's
    value"), for the guarantee that one node cannot write another's rows.
    ``seen``: shapes already walked (shared across documents of one surface).
    ``core_under``: top-level keys whose leaves get only the CORE mutants.
    ``leaf``: the mutants for every leaf; by default, those for the leaf's type (``BY_TYPE``).
    """
    seen = set() if seen is None else seen
    inner = tuple(inner)
    for path, value in walk(doc):
        key = shape(path, maps)
        if key in seen:
            continue
        seen.add(key)
        is_leaf = not isinstance(value, dict | list) or not value
        mutants = (tuple(leaf) if leaf is not None else for_leaf(value)) if is_leaf else inner
        if is_leaf and path[0] in core_under:
            mutants = CORE
        for mutant in mutants:
            if mutant.value is not DELETE and same(mutant.value, value):
                continue
            yield Case(path, mutant, mutate(doc, path, mutant.value))
        parent = path[-2] if len(path) > 1 else None
        if isinstance(path[-1], str) and parent in maps:
            for mutant in KEYS:
                yield Case(path, mutant, rename_key(doc, path, mutant.value))
        if foreign is not None and is_leaf:
            try:
                theirs = get(foreign, path)
            except (KeyError, IndexError, TypeError):
                continue
            if not same(theirs, value):
                yield Case(path, Mutant(f"the other node's value {short(theirs)}", theirs), mutate(doc, path, theirs))


def short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
