"""Reading a request body as JSON, with one rule for every listener: what is refused and in what words.

Python's decoder recurses once per nesting level, so a body of ten thousand
``[`` is a ``RecursionError`` (and a traceback in the log) rather than a
refusal; and a document just shallow enough to decode can still blow the
stack of whatever walks it afterwards (a schema check, a serializer). So a
body nested deeper than ``MAX_DEPTH`` is refused as such. No real request —
an OpenAI body with tools and JSON-schema parameters, an agent's report —
comes near that depth.

Pure: no Django, no I/O. Every caller turns ``BodyError`` into its own 400.
"""

from __future__ import annotations

import json
from typing import Any

# Deep enough for any JSON schema a client puts in a tool definition (those nest a
# few levels per property), shallow enough that a recursive walker over the result
# stays far from the interpreter's limit of 1,000 frames.
MAX_DEPTH = 64


class BodyError(ValueError):
    """The body is not JSON we accept; the message is a sentence for the caller."""


def loads(raw: bytes | str, *, max_depth: int = MAX_DEPTH) -> Any:
    """Decode ``raw`` as JSON, refusing invalid UTF-8, invalid JSON and nesting deeper than ``max_depth``."""
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes | bytearray) else raw
    except UnicodeDecodeError as exc:
        raise BodyError(f"the body is not UTF-8 (byte {exc.start}).") from None
    try:
        value = json.loads(text)
    except RecursionError:
        raise BodyError(f"the body is JSON nested deeper than {max_depth} levels.") from None
    except ValueError as exc:
        raise BodyError(f"the body is not valid JSON: {exc}.") from None
    if _might_be_deep(text, max_depth) and depth(value, max_depth) > max_depth:
        raise BodyError(f"the body is JSON nested deeper than {max_depth} levels.")
    return value


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
