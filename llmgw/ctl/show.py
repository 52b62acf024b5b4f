"""Small formatting helpers for the tables people read; scripts use --json instead."""

from __future__ import annotations

from rich.table import Table


def table(*columns: str, title: str | None = None) -> Table:
    t = Table(*columns, title=title, title_justify="left", box=None, header_style="bold", pad_edge=False)
    return t


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
