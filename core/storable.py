"""What no column can hold: the one rule behind the API's, the reports' and the heartbeats' refusals.

Three things in a decoded JSON value cannot be stored:

- a NUL character: PostgreSQL's text and jsonb refuse it;
- a lone surrogate (``\\ud800``-``\\udfff`` unpaired): not UTF-8, which
  PostgreSQL cannot then hold;
- NaN or infinity: Python's JSON reader accepts them, JSON (and jsonb)
  has neither.

:func:`problems` finds each, key or value, with where it lies; each caller
words its refusal (the admin API in api.base, the agent's documents in
inventory.report_schema). Pure: no Django, no I/O.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any, NamedTuple

import orjson

NUL = "a NUL character"
SURROGATE = "a lone surrogate"
NOT_FINITE = "not finite"


class Problem(NamedTuple):
    """One value that cannot be stored: where it is (``report.gpus[0].uuid``), which kind, the value itself.

    ``key``: the value is a key of the object at ``path``, not a value in it.
    """

    path: str
    kind: str
    value: Any
    key: bool = False


def text_problem(text: str) -> str | None:
    """The kind of problem a string holds (:data:`SURROGATE` or :data:`NUL`), or None when it can be stored.

    A string with both is a surrogate's problem: it is not Unicode at all, and
    a reader that refuses only surrogates (core.jsonbody's) must not see it
    reported as a NUL and let it through.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return SURROGATE
    if "\x00" in text:
        return NUL
    return None


def problems(value: Any, where: str, *, fast: bool = True) -> Iterator[Problem]:
    """Each string, key or number in ``value`` that cannot be stored, with its path from ``where``.

    Walked with a stack, not recursion, so a deep document cannot exhaust it.
    ``fast``: first ask :func:`plainly_storable`, which answers most values
    at C speed; False walks every value (what that check is tested against).
    """
    if fast and plainly_storable(value):
        return
    stack: list[tuple[Any, str]] = [(value, where)]
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            kind = text_problem(item)
            if kind:
                yield Problem(path, kind, item)
        elif isinstance(item, float) and not math.isfinite(item):
            yield Problem(path, NOT_FINITE, item)
        elif isinstance(item, dict):
            for key, child in item.items():
                kind = text_problem(key) if isinstance(key, str) else None
                if kind:
                    yield Problem(path, kind, key, key=True)
                stack.append((child, f"{path}.{_escaped(key) if kind else key}"))
        elif isinstance(item, list):
            stack.extend((child, f"{path}[{i}]") for i, child in enumerate(item))


def _escaped(key: str) -> str:
    """A key that cannot be stored, as it is named in the path beneath it: by its escape (``b\\ud800``).

    The path is quoted in a refusal that is itself stored (a node's
    ``report_error``) or written by orjson (the heartbeat lane), neither of
    which can hold the character itself.
    """
    return repr(key)[1:-1]


def plainly_storable(value: Any) -> bool:
    """True when nothing in ``value`` can be unstorable, told by one encoding at C speed; False: walk it.

    The walk costs a couple of milliseconds of Python for an 8-GPU report,
    on every registration, report and heartbeat; an encoding is a tenth of
    that, and orjson's a fifth of json's (105 -> 20 us for a 12 KB report).
    orjson spells a NUL ``\\u0000`` (a string that holds those six characters
    also matches, and is walked), refuses a lone surrogate, and writes NaN
    and infinity as ``null``: so an encoding with a ``null`` in it is told
    again by json's encoder, which refuses them (a report seldom holds a
    null; an unknown reading is a key left out). Anything either cannot
    encode is walked too. So True is never wrong, and every problem is still
    found by the walk (tests/core/test_storable.py).
    """
    try:
        encoded = orjson.dumps(value)
    except (TypeError, RecursionError):  # orjson.JSONEncodeError is a TypeError
        return False
    if b"\\u0000" in encoded:
        return False
    if b"null" not in encoded:
        return True
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        return False
    return "\\u0000" not in text
