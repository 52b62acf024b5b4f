"""Prometheus's classic text format (0.0.4), written quickly for families of many gauge samples.

prometheus_client's ``generate_latest`` validates, escapes and sorts every
sample's labels afresh. The fleet's families are mostly gauges with a sample
per node or card, whose label values repeat (a node's name is in five
families and on each of its cards): at 10,000 nodes a scrape has some 36,000
such samples, and writing them was a third of the scrape's time. Here a gauge
family is written with each distinct label value escaped once and the order
of its labels worked out once; every other kind of family (histograms,
counters, summaries, info) and any gauge this fast path does not cover is
handed to ``generate_latest`` itself. The bytes are the library's: a
Hypothesis test (tests/observability/test_exposition.py) holds them equal to
``generate_latest``'s for any names, label values and values.

Written by hand rather than taken from a library because the only library
writing this format is prometheus_client, whose writer is the cost measured.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from prometheus_client import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.utils import floatToGoString

# Names the classic format writes as they are; any other goes to the library, which knows how to escape it.
_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


class _One:
    """A collector of one family, so that ``generate_latest`` writes just it."""

    def __init__(self, metric: Metric) -> None:
        self.metric = metric

    def collect(self) -> list[Metric]:
        return [self.metric]


def _escape_value(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")


class _Writer:
    """Writes gauge families, remembering escaped label values and written values across the families of one text."""

    def __init__(self) -> None:
        self.escaped: dict[str, str] = {}
        self.values: dict[float, str] = {}
        self.orders: dict[tuple[str, ...], tuple[tuple[int, str], ...] | None] = {}

    def _order(self, keys: tuple[str, ...]) -> tuple[tuple[int, str], ...] | None:
        """Where each label sits in the written order (the library sorts by name); None for a name it must escape."""
        order = self.orders.get(keys, ())
        if order == ():
            if all(_LABEL_NAME.fullmatch(k) for k in keys):
                order = tuple(sorted(((i, k) for i, k in enumerate(keys)), key=lambda pair: pair[1]))
            else:
                order = None
            self.orders[keys] = order
        return order

    def gauge(self, metric: Metric) -> str | None:
        """The family as the library writes it; None when it is not one this path covers."""
        name = metric.name
        if metric.type != "gauge" or not _METRIC_NAME.fullmatch(name):
            return None
        escaped, values = self.escaped, self.values
        lines = [f"# HELP {name} {_help(metric.documentation)}\n# TYPE {name} gauge\n"]
        for sample in metric.samples:
            if sample.name != name or sample.timestamp is not None:
                return None
            labels = sample.labels
            if labels:
                order = self._order(tuple(labels))
                if order is None:
                    return None
                items = tuple(labels.values())
                parts = []
                for i, key in order:
                    raw = items[i]
                    text = escaped.get(raw)
                    if text is None:
                        text = escaped[raw] = _escape_value(raw)
                    parts.append(f'{key}="{text}"')
                head = f"{name}{{{','.join(parts)}}}"
            else:
                head = name
            value = sample.value
            shown = values.get(value) if value else None
            if shown is None:
                # Zero is written afresh: -0.0 equals 0.0 as a key but is written "-0.0". A NaN never finds
                # itself in the dict either, and is written afresh each time, which is rare and right.
                shown = floatToGoString(value)
                if value:
                    values[value] = shown
            lines.append(f"{head} {shown}\n")
        return "".join(lines)


def text(families: Iterable[Metric]) -> bytes:
    """``generate_latest`` of a collector yielding ``families``, byte for byte, written faster for big gauges."""
    writer = _Writer()
    out = []
    for metric in families:
        written = writer.gauge(metric)
        out.append(written.encode("utf-8") if written is not None else generate_latest(_One(metric)))
    return b"".join(out)
