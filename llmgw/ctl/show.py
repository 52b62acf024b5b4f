"""Small formatting helpers for the tables people read; scripts use --json instead.

Text the server sends is the fleet's — a node chose its name, an engine wrote
its log lines — so it is never read as rich markup (``[rank0]`` would vanish,
``[/models/x]`` would crash ctl) nor let through as a terminal control
sequence. The rule is held in one place, by types rather than by care at each
call: ``Console`` and ``table`` print every plain ``str`` as literal text;
only a ``Markup`` value, made by :func:`markup` from ctl's own template with
every value escaped, is read as markup.
"""

from __future__ import annotations

import re
from typing import Any

import rich.console
from rich.markup import escape
from rich.table import Column, Table
from rich.text import Text

# C0 controls but tab and newline, DEL and the C1 controls: an ESC from a node must not
# reach the operator's terminal as an escape sequence (a title change, a cleared screen).
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


class Markup(str):
    """Rich markup ctl wrote itself; any server text in it was escaped by :func:`markup`."""


def clean(value: object) -> str:
    """``value`` as text with its control characters made visible (``\\x1b``)."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", str(value))


def markup(template: str, *values: object) -> Markup:
    """``template`` (ctl's own markup, ``{}`` for each value) with every value printed as text.

    A value that is itself ``Markup`` (made here) is kept as markup.
    """
    return Markup(template.format(*(v if isinstance(v, Markup) else escape(clean(v)) for v in values)))


def as_text(value: Any) -> Any:
    """What rich should render for ``value``: markup only when it is ``Markup``, a plain str as text."""
    if isinstance(value, Markup):
        return Text.from_markup(value, emoji=False)
    if isinstance(value, str):
        return Text(clean(value))
    return value


class Console(rich.console.Console):
    """A console that prints every plain string as text; see the module's docstring."""

    def print(self, *objects: Any, **kwargs: Any) -> None:
        super().print(*(as_text(o) for o in objects), **kwargs)


class SafeTable(Table):
    """A table whose headers, title and cells are text unless they are ``Markup``."""

    def __init__(self, *headers: Any, title: Any = None, **kwargs: Any) -> None:
        super().__init__(*(Column(header=as_text(h)) for h in headers), title=as_text(title), **kwargs)

    def add_row(self, *cells: Any, **kwargs: Any) -> None:
        super().add_row(*(as_text(c) for c in cells), **kwargs)


def table(*columns: Any, title: str | None = None) -> SafeTable:
    return SafeTable(*columns, title=title, title_justify="left", box=None, header_style="bold", pad_edge=False)


def size(n: int | None) -> str:
    if n is None:
        return "?"
    value = float(n)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if value < 1000 or unit == "TB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{n} B"


def ago(seconds: int | None) -> str:
    """How long, for people: 45s, 12m, 3h, 2d; '-' when never."""
    if seconds is None or seconds < 0:
        return "-"
    for unit, span in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= span:
            return f"{seconds // span}{unit}"
    return f"{seconds}s"


def fetch(progress: dict | None) -> str:
    """A download in flight: '25% of 16.0 GB', or only the bytes when the total is unknown."""
    if not progress:
        return ""
    if "percent" in progress:
        return f"{progress['percent']}% of {size(progress.get('bytes_total'))}"
    return f"{size(progress.get('bytes_done'))} so far"


def devices(counts: list[dict]) -> str:
    """Devices by class, free over total: '6/8 h100-80g, 0/4 a100-80g-mig-1g.20gb'."""
    return ", ".join(f"{c['free']}/{c['total']} {c['class']}" for c in counts) or "-"
