"""Small filters for the console's templates."""

from __future__ import annotations

from typing import Any

from django import template

from dashboard import present

register = template.Library()


@register.filter
def bytes_h(n: Any) -> str:
    return present.human_bytes(n) if isinstance(n, int | float) else "unknown"


@register.filter
def mib_h(n: Any) -> str:
    return present.human_bytes(n * 2**20) if isinstance(n, int | float) else "unknown"


@register.filter
def seconds_h(s: Any) -> str:
    return present.human_seconds(s) if isinstance(s, int | float) else "unknown"


@register.filter
def get(mapping: Any, key: Any) -> Any:
    """``d|get:"key"``: a dict's item by a key that is not a valid template name (dashes, numbers)."""
    return mapping.get(key) if isinstance(mapping, dict) else None


@register.filter
def spaced(names: Any) -> str:
    """Names as one space-separated attribute value: what the page's script matches updates against."""
    return " ".join(str(n) for n in names or [])
