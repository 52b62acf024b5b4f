"""Reading a request body as JSON, with one rule for every listener: what is refused and in what words.

Python's decoder recurses once per nesting level, so a body of ten thousand
``[`` is a ``RecursionError`` (and a traceback in the log) rather than a
refusal; and a document just shallow enough to decode can still blow the
stack of whatever walks it afterwards (a schema check, a serializer). So a
body nested deeper than ``MAX_DEPTH`` is refused as such. No real request —
an OpenAI body with tools and JSON-schema parameters, an agent's report —
comes near that depth.

A caller whose body goes on as text (the gateway's, to an engine) asks for
``unicode_only``: a lone surrogate's escape (``"\\ud800"``), which JSON may
spell and Python's reader takes, is then refused too, with where it is;
such text cannot be encoded, so it would fail wherever it went next.

Pure: no Django, no I/O. Every caller turns ``BodyError`` into its own 400.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

from core import storable

# Deep enough for any JSON schema a client puts in a tool definition (those nest a
# few levels per property), shallow enough that a recursive walker over the result
# stays far from the interpreter's limit of 1,000 frames.
MAX_DEPTH = 64


class BodyError(ValueError):
    """The body is not JSON we accept; the message is a sentence for the caller."""


def loads(raw: bytes | str, *, max_depth: int = MAX_DEPTH, unicode_only: bool = False) -> Any:
    """Decode ``raw`` as JSON, refusing invalid UTF-8, invalid JSON and nesting deeper than ``max_depth``.

    ``unicode_only``: refuse a lone surrogate too, in any key or value.
    """
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes | bytearray) else raw
    except UnicodeDecodeError as exc:
        raise BodyError(f"the body is not UTF-8 (byte {exc.start}).") from None
    value = _read_fast(text, raw if isinstance(raw, bytes | bytearray) else text.encode("utf-8", "surrogatepass"))
    if read_by_json := value is _NOT_READ:
        try:
            value = json.loads(text)
        except RecursionError:
            raise BodyError(f"the body is JSON nested deeper than {max_depth} levels.") from None
        except ValueError as exc:
            raise BodyError(f"the body is not valid JSON: {exc}.") from None
    if _might_be_deep(text, max_depth) and depth(value, max_depth) > max_depth:
        raise BodyError(f"the body is JSON nested deeper than {max_depth} levels.")
    if unicode_only and read_by_json:
        # Only json's reader lets a lone surrogate through (orjson refuses it), so only its bodies are walked.
        _refuse_lone_surrogates(value)
    return value


def _refuse_lone_surrogates(value: Any) -> None:
    for problem in storable.problems(value, "body"):
        if problem.kind == storable.SURROGATE:
            where = f"a key of {problem.path}" if problem.key else problem.path
            raise BodyError(
                f"the body holds a lone surrogate (an unpaired \\ud800-\\udfff escape) in {where}; "
                "JSON text must be Unicode: send the character itself, or both halves of its pair."
            )


_NOT_READ = object()
# Each digit made a 0 and every other byte a space: a run of 19 digits may be an integer past 64 bits, which
# orjson reads as a float (10**30 -> 1e30) where json keeps it an int, so such a body is read by json. (A
# regular expression looking for the run cost as much as json's whole read of a report; this, a tenth.)
_DIGITS_AS_ZEROS = bytes(0x30 if 0x30 <= c <= 0x39 else 0x20 for c in range(256))
_LONG_NUMBER = b"0" * 19


def _read_fast(text: str, raw: bytes) -> Any:
    """``text`` read by orjson (a third of json's time for a 12 KB report), or ``_NOT_READ``.

    Only where orjson's value is json's: a body it refuses (NaN, Infinity,
    1e400, a lone surrogate's escape, anything invalid) or one that may hold
    an integer past 64 bits is left to json, whose value or refusal, in its
    words, is the answer as before (tests/core/test_jsonbody.py holds the two
    to each other). ``raw`` is ``text``'s UTF-8 bytes.
    """
    if _LONG_NUMBER in raw.translate(_DIGITS_AS_ZEROS):
        return _NOT_READ
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return _NOT_READ


def _might_be_deep(text: str, max_depth: int) -> bool:
    # Counting brackets is a C-speed scan; only a body with more openers than the
    # limit can be too deep, so the common small body is never walked.
    return text.count("[") + text.count("{") > max_depth


def depth(value: Any, stop_past: int = MAX_DEPTH) -> int:
    """How deeply ``value`` nests (a scalar is 0, ``[]`` is 1), stopping once it exceeds ``stop_past``.

    Level by level, each level's containers gathered by one comprehension:
    iterative, so it cannot itself run out of stack, and a third of the time
    of a walk with a stack (a 12 KB report: 140 -> 46 us, on every
    registration and full report).
    """
    level = [value] if isinstance(value, _CONTAINERS) else []
    deepest = 0
    while level:
        deepest += 1
        if deepest > stop_past:
            return deepest
        level = [
            child
            for item in level
            for child in (item.values() if isinstance(item, dict) else item)
            if isinstance(child, _CONTAINERS)
        ]
    return deepest


_CONTAINERS = (dict, list)
