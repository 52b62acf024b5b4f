"""Small filters for the console's templates."""

from __future__ import annotations

import functools
import unicodedata
from typing import Any

from django import template
from django.utils.formats import localize
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe
from django.utils.text import Truncator

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
def joined_clipped(names: Any, limit: Any) -> SafeString:
    """``names|join:", "|truncatechars:limit``, the same text, from only the names that can show.

    A partition of a large fleet names thousands of nodes, and the fleet page showed the first
    300 characters of them all joined, each escaped first: 76,000 escapes at 10,000 nodes. The
    text is cut where the whole one would be, since what truncatechars keeps depends only on the
    first ``limit`` + 1 characters it counts (it does not count combining marks, nor here).
    """
    length = int(limit)
    pieces, counted = [], -2  # the first name has no separator before it
    for name in names or []:
        piece = escape(name)
        pieces.append(piece)
        # Counted as truncatechars counts: after NFC (decomposed Hangul is one letter), no combining marks.
        counted += 2 + sum(1 for char in unicodedata.normalize("NFC", piece) if not unicodedata.combining(char))
        if counted > length:
            break
    # The names are escaped; cutting keeps them so (an entity cut short, as truncatechars cut it).
    return mark_safe(Truncator(", ".join(pieces)).chars(length))


@register.filter
def spaced(names: Any) -> str:
    """Names as one space-separated attribute value: what the page's script matches updates against."""
    return " ".join(str(n) for n in names or [])


@functools.lru_cache(maxsize=4096, typed=True)
def _n(value: Any) -> str:
    """A coordinate as rack.svg draws its numbers: escaped, localization off.

    Remembered: a rack's chips sit at the same few x positions in every tray and its trays at the
    same y in every rack, and each drawing was a walk through Django's number formatting. Typed,
    since 1 and 1.0 are equal keys that are drawn differently.
    """
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


@register.filter
def trays_svg(trays: Any) -> SafeString:
    """A rack's trays (dashboard.racks.Tray) with their chips, as rack.svg's loop over them drew them: the same bytes.

    Drawn here for the reason :func:`chips_svg` is: 1,800 trays of a dozen values each on the NVLink page at
    10,000 nodes, and the loop's lookups were most of what was left of its time.
    """
    out = []
    for t in trays:
        (x1, x2), mid = t.link, _n(t.mid)
        imex = escape(t.imex)
        out.append(
            f'\n  <g class="tray" data-tray="{escape(t.node)}" data-state="{escape(t.state)}">'
            f"\n    <title>{escape(t.title)}</title>"
            f'\n    <line class="link" x1="{_n(x1)}" y1="{mid}" x2="{_n(x2)}" y2="{mid}"/>'
            f'\n    <rect class="tray-body" x="{_n(t.x)}" y="{_n(t.y)}" width="{_n(t.w)}" height="{_n(t.h)}" rx="3"/>'
            f'\n    <text class="tray-label" x="{_n(t.label_x)}" y="{_n(t.text_y)}">{escape(t.label)}</text>'
            f"\n    {chips_svg(t.chips)}"
            f'\n    <circle class="imex" data-imex="{imex}" cx="{_n(t.imex_x)}" cy="{mid}" r="3">'
            f"<title>IMEX {imex}</title></circle>"
            "\n  </g>\n  "
        )
    return mark_safe("".join(out))  # every value in it is escaped, here and in chips_svg
