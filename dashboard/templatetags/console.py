"""Small filters for the console's templates."""

from __future__ import annotations

from typing import Any

from django import template
from django.utils.formats import localize
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

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


def _n(value: Any) -> str:
    """A coordinate as rack.svg draws its numbers: escaped, localization off."""
    return escape(localize(value, use_l10n=False))


@register.filter
def chips_svg(chips: Any) -> SafeString:
    """A tray's chips (dashboard.racks.Chip) as rack.svg's loop over them drew them: the same bytes.

    Drawn here, not by a template loop: a rack has 72 chips of ten values each, and the loop's
    lookups and escapes for them were most of the NVLink page's time (100 racks at 10,000 nodes).
    """
    out = []
    for c in chips:
        hx, hy, hw, hh = (_n(v) for v in c.halo)
        unhealthy = "" if c.healthy else ' data-unhealthy="1"'
        out.append(
            f'\n    <g class="chip" data-gpu="{escape(c.gpu)}" data-state="{escape(c.state)}"{unhealthy}>'
            f"\n      <title>{escape(c.title)}</title>"
            f'\n      <rect class="halo" x="{hx}" y="{hy}" width="{hw}" height="{hh}" rx="3"/>'
            f'\n      <rect class="die" x="{_n(c.x)}" y="{_n(c.y)}" width="{_n(c.w)}" height="{_n(c.h)}" rx="2"/>'
            "\n    </g>\n    "
        )
    return mark_safe("".join(out))  # every value in it is escaped above
