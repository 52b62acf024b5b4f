"""A request body's fields, checked against the columns they land in.

The bounds are read from the model fields themselves by ``core.columns``
(a ``CharField``'s ``max_length``, the database's range for an integer
field; the reports agents send are bounded by the same reading), so the
API's checks cannot drift from the schema: a column made longer in a
migration accepts longer names here at once. Every refusal is a 400 whose sentence
starts with the field's path (``models[2] is 129 characters; …``), which
``ctl`` prints as it is.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db.models import Field

from api.base import Refused
from core.columns import integer_range, max_length


def refuse(path: str, problem: str) -> Refused:
    return Refused(400, f"{path} {problem}")


def only(body: dict[str, Any], allowed: Iterable[str]) -> None:
    """Refuse a field the endpoint does not know: a typo (``model`` for ``models``) must not pass silently."""
    known = list(allowed)
    for name in body:
        if name not in known:
            raise refuse(str(name)[:100], f"is not a field here; the fields are {', '.join(known)}")


def text(value: Any, path: str, column: Field, *, required: bool | str = False) -> str | None:
    """A string that fits ``column``; None when absent and not required. Blank counts as absent.

    ``required`` may be the sentence to refuse an absent value with.
    """
    if value is None or value == "":
        if required:
            raise Refused(400, required) if isinstance(required, str) else refuse(path, "is required")
        return None
    if not isinstance(value, str):
        raise refuse(path, f"must be text, not {_kind(value)}")
    limit = max_length(column)
    if limit is not None and len(value) > limit:
        raise refuse(path, f"is {len(value)} characters; at most {limit} fit")
    return value


def texts(value: Any, path: str, column: Field, *, what: str = "names") -> list[str] | None:
    """A list of non-empty strings that each fit ``column``; None when absent."""
    if value is None:
        return None
    if not isinstance(value, list):
        raise refuse(path, f"must be a list of {what}, not {_kind(value)}")
    return [text(item, f"{path}[{i}]", column, required=True) or "" for i, item in enumerate(value)]


def whole(value: Any, path: str, column: Field, *, required: bool = False, unit: str = "") -> int | None:
    """A whole number within the range the database gives ``column``'s type; None when absent."""
    low, high = integer_range(column)
    span = f"a whole number{' of ' + unit if unit else ''} from {low} to {high}"
    if value is None:
        if required:
            raise refuse(path, f"is required: {span}")
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise refuse(path, f"must be {span}, not {_kind(value)}")
    if (low is not None and value < low) or (high is not None and value > high):
        # A number of a thousand digits is not worth echoing, nor cheap to turn into text.
        shown = value if abs(value) < 10**30 else "a larger number"
        raise refuse(path, f"must be {span} (got {shown})")
    return value


def choice(value: Any, path: str, choices: Iterable[str], *, default: str | None = None) -> str:
    """One of ``choices``; ``default`` when absent (required when there is none)."""
    options = list(choices)
    if value is None and default is not None:
        return default
    if not isinstance(value, str) or value not in options:
        got = repr(value) if isinstance(value, str) and len(value) < 40 else _kind(value)
        listed = ", ".join(options[:-1]) + f" or {options[-1]}" if len(options) > 1 else options[0]
        raise refuse(path, f"must be {listed} (got {got})")
    return value


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "text", bool: "true/false", type(None): "null"}.get(
        type(value), "a number"
    )
