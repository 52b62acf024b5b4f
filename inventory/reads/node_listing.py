"""The API's node listing as JSON text, a page at a time: each node's cards and ports aggregated by PostgreSQL.

``GET /api/v1/nodes`` is the largest answer the control plane gives (ten
thousand nodes, seventy thousand cards). It is built here from plain rows,
not from the console's views: one query a page, whose every node brings its
cards and ports as two JSON texts; what the nodes of a page share (an HGX
box's eight cards) is worked out and encoded once. The bytes are those of
encoding inventory.reads.nodes.node_pages's views (tested in
tests/api/test_node_listing_json.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from itertools import pairwise
from typing import Any, NamedTuple

from django.db import connection
from django.db.models import Model, QuerySet
from django.db.models.expressions import RawSQL
from django.utils import timezone

from core import cycles
from core.compiled import CompiledQuery
from core.jsonrows import DecodedOnce, values_list_as_text
from core.pipelined import Sent, overlapped
from inventory import devices
from inventory.models import GPU, IBPort, Node
from inventory.reads import nodes
from inventory.reads.nodes import (
    _GPU_WIRING,
    PORT_FIELDS,
    NodeUsage,
    _domain_keys,
    _gpu_brief,
    _node_domain,
    _node_view_of,
    _port_view,
)

_NODE_LISTED = ("id", "name", "state", "reachable", "lost", "labels", "hostname", "mgmt_addr", "report_error")
_NODE_LISTED += ("agent_version", "os", "os_version", "arch", "cpu_flags", "memory_mb", "engines", "weights")
_NODE_LISTED += ("fabrics", "disks", "last_seen", "load", "imex_state", "imex_channels")
_NODE_LISTED_JSON = ("labels", "cpu_flags", "engines", "weights", "fabrics", "disks", "load", "imex_channels")
# What it reads of each card: what the listing's counts and views read (GPU_LIST_FIELDS, health, the wiring).
_CARD_COUNTED = ("index", "gpu_class", "health", "parent_index", "mig_mode", "mig_uuid", "domain_id")


class _NodeRow:
    """A node's listed columns from a values() row: what the views read of a Node, without building one."""

    __slots__ = (*_NODE_LISTED, "pk")
    has_avx2 = Node.has_avx2  # the model's own property; it reads only cpu_flags

    def __init__(self, row: Mapping[str, Any]) -> None:
        for name in _NODE_LISTED:
            setattr(self, name, row[name])
        self.pk = row["id"]


class _Cards:
    """What one set of card rows comes to, worked out once for every node of a page whose cards are those rows.

    The nodes of a kind have the same cards, row for row (an HGX box's eight,
    a rack's trays in one domain); what differs between them, the GPUs their
    shards hold, is counted per set of GPUs held (:meth:`counts`).
    """

    __slots__ = ("_counts", "domain", "gpus", "listed", "unhealthy")

    def __init__(
        self,
        rows: Iterable[tuple],
        columns: tuple[str, ...],
        domains: Mapping[int, str],
        nearest: dict,
        dumps: Callable[[Any], str] | None,
    ) -> None:
        gpus = []
        for row in rows:
            g = dict(zip(columns, row, strict=True))
            g["health"] = g["health"] or []  # as the listing reads it: JSON null or nothing is no problem
            gpus.append(g)
        self.gpus = gpus
        self.unhealthy = devices.out_of_placement(gpus)
        self.domain = _node_domain(gpus, domains)
        # The cards as the listing shows them, as JSON: encoded once for all the nodes that have them.
        self.listed = None if dumps is None else dumps([_gpu_brief(g, domains, nearest) for g in gpus])
        self._counts: dict[frozenset[int], list[dict[str, Any]]] = {}

    def counts(self, used: set[int]) -> list[dict[str, Any]]:
        """The devices by class when the GPUs ``used`` are held (``devices.count_by_class``)."""
        key = frozenset(used)
        if (by_class := self._counts.get(key)) is None:
            by_class = self._counts[key] = devices.count_by_class(self.gpus, used)
        return by_class


def node_pages_json(
    usage: NodeUsage,
    dumps: Callable[[Any], str],
    now: datetime | None = None,
    fields: frozenset[str] | None = None,
    size: int | None = None,
) -> Iterator[list[str]]:
    """The API's listing, :func:`node_pages` with the wiring, as each node's JSON text (``dumps``'s), a page at a time.

    The same text as ``dumps`` of :func:`node_pages`'s views, and the same
    pages (tested against it), read in fewer queries (three a page: nodes,
    cards, ports) and built with far less work per node. No model instance:
    each node's columns, cards and ports are read as plain rows; and what a
    page's nodes share is worked out and encoded once. A set of card rows
    (an HGX box's eight cards) comes to the same counts, problems, domain and
    ``gpus`` JSON on every node that has it, and a set of port rows to the
    same ``ib_ports`` JSON; each node's own columns are still its own.
    What is shared is kept for one page only, so memory stays one page's.

    Each page's queries are sent before the page before it is built
    (``core.pipelined``): PostgreSQL reads a page while Python builds the
    last: at 10,000 nodes on two cores, in-process, 1.5 s became 0.95–1.0 s.

    A page is one query: each node's cards and its ports come with its row
    as two JSON texts that PostgreSQL aggregates (:class:`_Aggregated`), so
    Python receives one row a node, not one a card and one a port, and a text
    nodes share is parsed once.
    """
    now, size = now or timezone.now(), size or nodes.NODE_PAGE
    wiring = _Wiring.of(fields)
    domains = _domain_keys()

    def built(page: _PageRows) -> list[str]:
        with cycles.uncollected():
            return _node_texts(page, wiring, usage, dumps, now, fields, domains)

    yield from _Aggregated(wiring).pages(size, built)


class _Wiring(NamedTuple):
    """Whether a listing shows the cards (``gpus``) and the ports (``ib_ports``): decided by its fields, once."""

    cards: bool
    ports: bool

    @classmethod
    def of(cls, fields: frozenset[str] | None) -> _Wiring:
        return cls(fields is None or "gpus" in fields, fields is None or "ib_ports" in fields)

    @property
    def card_columns(self) -> tuple[str, ...]:
        """What is read of each card: what the counts need, and what ``gpus`` shows when it is shown."""
        return (*_CARD_COUNTED, *(_GPU_WIRING if self.cards else ()))


class _PageRows:
    """A page's nodes by name, and by node id the JSON text of its cards' rows and that of its ports' rows.

    Two nodes with equal texts have the same rows (:meth:`card_rows`,
    :meth:`port_rows`); a node missing from a map has none.
    """

    __slots__ = ("cards", "nodes", "ports")

    def __init__(self, nodes: list[_NodeRow], cards: dict[int, str], ports: dict[int, str]) -> None:
        self.nodes, self.cards, self.ports = nodes, cards, ports

    def card_rows(self, key: str) -> tuple[tuple, ...]:
        """The cards' rows (in ``_Wiring.card_columns``'s columns) a text of :attr:`cards` stands for."""
        return _Aggregated.card_rows(key)

    def port_rows(self, key: str) -> tuple[tuple, ...]:
        """The ports' rows (in ``PORT_FIELDS``'s columns) a text of :attr:`ports` stands for."""
        return _Aggregated.port_rows(key)


class _Aggregated:
    """The SQL that reads each node's cards and ports as one JSON text each, beside the node's own columns.

    Each is an array of the rows, each row an array of the columns in the
    order ``values_list`` would read them, its JSON columns as their values,
    embedded (their text escaped inside the text cost PostgreSQL a sixth
    more), and the one float column (``rate_gbps``) is made a float again,
    since JSON writes 400.0 as 400. A node with no card
    (or port) has NULL. In the same statement as the nodes, so a node is
    always read with its own cards and ports.
    """

    CARDS, PORTS = "_listed_cards", "_listed_ports"
    _RATE = PORT_FIELDS.index("rate_gbps")

    def __init__(self, wiring: _Wiring) -> None:
        self.columns = {self.CARDS: _rows_as_json(GPU, wiring.card_columns, ("index",))}
        self.ports = wiring.ports
        if wiring.ports:
            self.columns[self.PORTS] = _rows_as_json(IBPort, PORT_FIELDS, ("hca", "port"))
        # A page's query is built and compiled once a listing, not once a page: building it was a
        # tenth of a 10,000-node listing's time. One for each kind of range: open at either end or not.
        self._queries = {
            (None, None): CompiledQuery(lambda: self._page(Node.objects.all())),
            (str, None): CompiledQuery(lambda low: self._page(Node.objects.filter(name__gt=low))),
            (None, str): CompiledQuery(lambda high: self._page(Node.objects.filter(name__lte=high))),
            (str, str): CompiledQuery(lambda low, high: self._page(Node.objects.filter(name__gt=low, name__lte=high))),
        }

    def pages(self, size: int, built: Callable[[_PageRows], list[str]]) -> Iterator[list[str]]:
        """Every node by name, ``built`` a page at a time, each page's query sent before the page before is read.

        The pages' ranges of names are read first, one name in ``size``: a
        page's query needs no rows of the page before, so it goes out before
        that page's rows are even read, and PostgreSQL aggregates a page while
        Python reads and builds the last. A node added while the pages are
        read is listed if its name falls in a range not yet sent, and one
        removed is listed if its range was sent before it went; every other
        node exactly once.
        """
        names = Node.objects.order_by("name").values_list("name", flat=True)
        ranges = list(pairwise([None, *list(names)[size - 1 :: size], None]))
        with overlapped():
            sent = self._send(ranges[0])
        for following in [*ranges[1:], None]:
            with overlapped():
                # The next page goes out first; this one's rows came in when the block before ended.
                after = self._send(following) if following is not None else None
                page = self._received(sent)
                texts = built(page) if page.nodes else []
            sent = after
            if texts:
                yield texts

    def _send(self, names: tuple[str | None, str | None]) -> Sent:
        """A page's query, sent: the nodes by name after ``names[0]`` up to ``names[1]`` (None: no end)."""
        query = self._queries[tuple(None if n is None else str for n in names)]
        return query.send(*(n for n in names if n is not None))

    def _page(self, nodes: QuerySet) -> QuerySet:
        rows = nodes.order_by("name").annotate(**self.columns)
        return values_list_as_text(rows, (*_NODE_LISTED, *self.columns), _NODE_LISTED_JSON)

    def _received(self, sent: Sent) -> _PageRows:
        """A page's nodes, each keyed to its cards' and ports' texts (nodes with the same cards, the same text)."""
        rows = sent.rows()
        nodes, first = _node_rows(rows), len(_NODE_LISTED)
        cards = {n.pk: row[first] for n, row in zip(nodes, rows, strict=True) if row[first] is not None}
        ports = {n.pk: row[first + 1] for n, row in zip(nodes, rows, strict=True) if self.ports and row[first + 1]}
        return _PageRows(nodes, cards, ports)

    @staticmethod
    def card_rows(text: str | None) -> tuple[tuple, ...]:
        return tuple(map(tuple, json.loads(text))) if text else ()

    @classmethod
    def port_rows(cls, text: str | None) -> tuple[tuple, ...]:
        if not text:
            return ()
        rows = json.loads(text)
        for row in rows:
            if (rate := row[cls._RATE]) is not None:
                row[cls._RATE] = float(rate)
        return tuple(map(tuple, rows))


def _rows_as_json(model: type[Model], columns: Sequence[str], order: Sequence[str]) -> RawSQL:
    """A node's rows of ``model`` (by its ``node_id``) as one JSON array of arrays of ``columns``, by ``order``."""
    quote = connection.ops.quote_name

    def column(name: str) -> str:
        return "r." + quote(model._meta.get_field(name).column)

    node = f"{quote(Node._meta.db_table)}.{quote(Node._meta.pk.column)}"
    return RawSQL(
        f"(SELECT json_agg(json_build_array({', '.join(map(column, columns))}) "
        f"ORDER BY {', '.join(map(column, order))})::text "
        f"FROM {quote(model._meta.db_table)} r WHERE r.{quote(model._meta.get_field('node').column)} = {node})",
        (),
    )


def _node_rows(rows: Iterable[tuple]) -> list[_NodeRow]:
    """The nodes of rows whose first columns are ``_NODE_LISTED``'s, JSON columns as text (decoded once each)."""
    decode = DecodedOnce()
    nodes = []
    for row in rows:
        values = dict(zip(_NODE_LISTED, row[: len(_NODE_LISTED)], strict=True))
        for field in _NODE_LISTED_JSON:
            values[field] = decode(values[field])
        nodes.append(_NodeRow(values))
    return nodes


def _node_texts(
    page: _PageRows,
    wiring: _Wiring,
    usage: NodeUsage,
    dumps: Callable[[Any], str],
    now: datetime,
    fields: frozenset[str] | None,
    domains: Mapping[int, str],
) -> list[str]:
    """The JSON of each node of ``page``, with its cards and ports as ``wiring`` says."""
    cards, ports, columns = wiring.cards, wiring.ports, wiring.card_columns
    # Keyed by the rows' JSON text, so nodes share only what is the same row for row.
    kinds: dict[Hashable, _Cards] = {}
    port_texts: dict[Hashable, str] = {}
    nearest: dict[tuple, tuple[str, str] | None] = {}
    physical: dict[tuple, tuple[str, str]] = {}
    out = []
    for n in page.nodes:
        mine = page.cards.get(n.pk, ())
        if (kind := kinds.get(mine)) is None:
            rows = page.card_rows(mine)
            kind = kinds[mine] = _Cards(rows, columns, domains, nearest, dumps if cards else None)
        by_class = kind.counts(usage.used.get(n.pk, set()))
        view = _node_view_of(n, by_class, kind.unhealthy, kind.domain, len(usage.replicas.get(n.pk, ())), now)
        text = dumps(view if fields is None else {k: v for k, v in view.items() if k in fields})
        wiring = []
        if cards:
            wiring.append('"gpus":' + kind.listed)
        if ports:
            mine = page.ports.get(n.pk, ())
            if (listed := port_texts.get(mine)) is None:
                rows = page.port_rows(mine)
                listed = port_texts[mine] = dumps([_port_view(p, physical) for p in _port_rows(rows)])
            wiring.append('"ib_ports":' + listed)
        if wiring:
            # The view's JSON object with the cards and ports last, where node_pages puts them.
            text = text[:-1] + ("," if text != "{}" else "") + ",".join(wiring) + "}"
        out.append(text)
    return out


def _port_rows(rows: Iterable[tuple]) -> Iterator[dict[str, Any]]:
    """Port rows of ``PORT_FIELDS`` as the values() rows ``_port_view`` reads."""
    for row in rows:
        yield dict(zip(PORT_FIELDS, row, strict=True))
