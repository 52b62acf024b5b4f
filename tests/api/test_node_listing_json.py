"""The API's node listing built as JSON text (node_pages_json) is byte for byte what encoding node_pages gave.

``GET /api/v1/nodes`` used to encode each view of ``node_pages`` (the views
the console shows too). It now reads plain rows and encodes once what the
nodes of a page share. The reference below is the way it was, kept here: the
views of ``node_pages`` with the wiring, each encoded as ``api.base`` encoded
them before (``json.dumps`` with DRF's encoder, compact). They are compared
page by page on a fleet with a bit of everything, for the whole listing and
for ``?fields=`` subsets, with pages small enough that nodes sharing cards
fall on several pages.
"""

from __future__ import annotations

import json
from datetime import timedelta
from itertools import pairwise

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.utils.encoders import JSONEncoder

from api.base import _array_chunks, dumps
from inventory.models import GPU, IBPort, Node
from placement.models import Shard
from placement.reads import node_pages, node_pages_json
from tests.api.fleet import add_model, ingest_fleet, place
from tests.placement.dbfleet import fleet
from tests.placement.test_snapshot_rows import varied_fleet

pytestmark = pytest.mark.django_db


def reference_pages(now, fields=None, size=None) -> list[list[str]]:
    """The listing as it was built: node_pages's views, each encoded by json.dumps with DRF's encoder."""
    return [
        [json.dumps(view, cls=JSONEncoder, ensure_ascii=False, separators=(",", ":")) for view in page]
        for page in node_pages(now=now, fields=fields, wiring=True, size=size)
    ]


def listed_pages(now, fields=None, size=None, in_database=None) -> list[list[str]]:
    return list(node_pages_json(dumps, now=now, fields=fields, size=size, in_database=in_database))


def everything_fleet() -> None:
    """The snapshot tests' varied fleet, with replicas, fresh and stale loads, disks, a bare node and odd ports."""
    varied_fleet()  # HGX, NVL72 trays, MIG, CPU-only; unhealthy, held, lost, unreachable, cordoned; odd ports
    model = add_model()
    now = timezone.now()
    place(model, "hgx-000", [0, 1])
    place(model, "nvl72-00-tray-11", [2])  # the same cards as trays 10 and 12, other GPUs held
    wide = place(model, "nvl72-00-tray-00", [0, 1, 2, 3])
    Shard.objects.create(replica=wide, node=Node.objects.get(name="nvl72-00-tray-01"), rank=1, gpu_indices=[0, 1])
    mig = Node.objects.get(name="mig-00")
    instance = GPU.objects.filter(node=mig, parent_index__isnull=False).order_by("index").first()
    place(model, "mig-00", [instance.index])
    Node.objects.create(name="bare")  # never heard from: no cards, ports, columns
    Node.objects.create(name="zz-ünïcode", hostname="höst", labels={"é": "ü", "n": 1.5})
    load = {"cpu_percent": 12.5, "load1": 3.0, "memory_used_mb": 1024, "memory_total_mb": 4096}
    Node.objects.filter(name="nvl72-00-tray-10").update(load=load, last_seen=now - timedelta(seconds=5))
    Node.objects.filter(name="hgx-000").update(load=load, last_seen=now - timedelta(minutes=5), report_error="bad")
    Node.objects.filter(name="cpu-01").update(arch="x86_64", cpu_flags=["sse4_2"], disks=[{"total_bytes": 2**40}])
    # Port counters that differ between nodes, as a real fleet's traffic does; a rate that is not whole.
    for i, port in enumerate(IBPort.objects.filter(node__name__in=["hgx-000", "nvl72-00-tray-10"])):
        IBPort.objects.filter(pk=port.pk).update(counters={"port_xmit_data": 10**12 + i, "symbol_error": i % 3})
    IBPort.objects.filter(pk=IBPort.objects.filter(node__name="nvl72-00-tray-10").first().pk).update(rate_gbps=26.5625)


FIELDS = [
    None,
    frozenset({"id", "state", "gpu_free"}),
    frozenset({"id", "state", "reachable", "devices", "replicas", "nvlink_domain", "load", "last_seen_seconds"}),
    frozenset({"gpus"}),
    frozenset({"ib_ports"}),
    frozenset({"ib_ports", "id", "gpus", "unhealthy_gpus"}),
]


# PostgreSQL aggregates: the aggregated path is tested where the tests run on it (as they do by default).
AGGREGATED = pytest.param(
    True, marks=pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL aggregates"), id="aggregated"
)


@pytest.mark.parametrize("in_database", [AGGREGATED, pytest.param(False, id="rows")])
@pytest.mark.parametrize("fields", FIELDS, ids=lambda f: "all" if f is None else ",".join(sorted(f)))
def test_the_listing_is_the_json_of_the_views_it_replaced_page_by_page(fields, in_database):
    """Either way the cards and ports are read: aggregated by PostgreSQL into a text a node, or as rows."""
    everything_fleet()
    now = timezone.now()
    for size in (3, None):  # pages of three (cards shared across pages), and the default
        want = reference_pages(now, fields, size)
        got = listed_pages(now, fields, size, in_database)
        assert [len(p) for p in got] == [len(p) for p in want]
        for want_page, got_page in zip(want, got, strict=True):
            for w, g in zip(want_page, got_page, strict=True):
                assert g == w, json.loads(w)["id"] if fields is None else w[:80]
    # The fleet did tell the stories it was built for.
    whole = {n["id"]: n for page in listed_pages(now) for n in map(json.loads, page)}
    assert whole["bare"]["gpu_total"] == 0 and whole["bare"]["gpus"] == [] and whole["bare"]["ib_ports"] == []
    assert whole["nvl72-00-tray-11"]["replicas"] == 1 and whole["nvl72-00-tray-12"]["replicas"] == 0
    assert whole["nvl72-00-tray-11"]["gpu_free"] == whole["nvl72-00-tray-12"]["gpu_free"] - 1
    assert "load" in whole["nvl72-00-tray-10"] and "load" not in whole["hgx-000"]
    assert whole["hgx-000"]["unhealthy_gpus"] and whole["mig-00"]["devices"][0]["used"] == 1
    assert whole["nvl72-00-tray-00"].get("nvlink_domain") and whole["hgx-002"]["lost"]
    assert whole["cpu-01"]["warnings"] and whole["zz-ünïcode"]["labels"] == {"é": "ü", "n": "1.5"}
    assert any(p["errors"] for p in whole["nvl72-00-tray-10"]["ib_ports"])


def test_the_array_the_api_sends_is_the_one_it_sent_before():
    """Joined as the API streams it (api.base._array_chunks), the same bytes as encoding the views."""
    everything_fleet()
    now = timezone.now()
    before = b"".join(_array_chunks(node_pages(now=now, wiring=True, size=4)))
    assert b"".join(_array_chunks(node_pages_json(dumps, now=now, size=4), encoded=True)) == before


def queries_a_page(size: int, in_database: bool) -> tuple[int, list[int]]:
    """(queries up to the end of the first page, queries of each later page) for the listing in pages of ``size``."""
    with CaptureQueriesContext(connection) as seen:
        after = [len(seen) for _ in node_pages_json(dumps, size=size, in_database=in_database)]
    return after[0], [b - a for a, b in pairwise(after)]


@pytest.mark.parametrize(
    ("in_database", "per_page"), [pytest.param(True, 1, marks=AGGREGATED.marks, id="aggregated"), (False, 3)]
)
def test_each_page_takes_the_same_queries_whatever_the_fleet_and_its_cards(in_database, per_page):
    """Aggregated, one a page (the nodes bring their cards and ports); as rows, three: nodes, cards, ports.
    For a page of CPU nodes as for one of 18 NVL72 trays."""
    fleet("h100-hgx:2,cpu:2")
    first_small, small = queries_a_page(2, in_database)
    fleet("gb200-nvl72:1,a100-mig:2")
    assert Node.objects.count() == 24
    first_big, big = queries_a_page(2, in_database)
    assert first_big == first_small, "the first page: the shards, the domains, its own"
    assert len(big) == 11 and len(small) == 1, "pages after the first"
    assert set(big) == set(small) == {per_page}


def test_postgresql_aggregates_on_its_own_and_sqlite_reads_rows():
    with CaptureQueriesContext(connection) as seen:
        list(node_pages_json(dumps))
    aggregated = any("json_agg" in q["sql"] for q in seen.captured_queries)
    assert aggregated == (connection.vendor == "postgresql")


def test_the_whole_listing_takes_the_same_queries_for_six_nodes_as_for_thirty():
    fleet("h100-hgx:2,a100-mig:2,cpu:2")
    with CaptureQueriesContext(connection) as six:
        assert sum(len(p) for p in node_pages_json(dumps)) == 6
    ingest_fleet("gb200-nvl72:1,h100-hgx:6@south", prefix="b-")
    with CaptureQueriesContext(connection) as many:
        assert sum(len(p) for p in node_pages_json(dumps)) == 30
    assert len(many) == len(six), "one page either way: the same queries"


def test_a_node_registered_inside_a_page_between_its_queries_leaves_no_node_without_its_cards(monkeypatch):
    """Read as rows, the cards and ports are read by the page's window of names, in queries after the nodes': a
    node added in the page's range in between moves that window past the page's last node, whose rows are then
    read by id. (Aggregated, a node's cards and ports are read in its own row's statement.)"""
    from inventory.reads import nodes as listing

    fleet("h100-hgx:4")
    now = timezone.now()
    want = {json.loads(t)["id"]: t for page in listed_pages(now, size=2, in_database=False) for t in page}
    sends = listing._PageSent._card_rows
    added = []

    def cards_sent_after_a_registration(self, nodes):
        if not added:  # the first page's cards: its nodes' rows are already read
            added.append(Node.objects.create(name="hgx-000a"))
        return sends(self, nodes)

    monkeypatch.setattr(listing._PageSent, "_card_rows", cards_sent_after_a_registration)
    with CaptureQueriesContext(connection) as seen:
        got = [json.loads(t) for page in listed_pages(now, size=2, in_database=False) for t in page]
    assert added and [n["id"] for n in got] == ["hgx-000", "hgx-001", "hgx-002", "hgx-003"]
    # The first page's last node was outside the moved window: read again, with all its cards and ports.
    assert got[1]["gpu_total"] == 8 and len(got[1]["gpus"]) == 8 and got[1]["ib_ports"]
    assert [json.dumps(n, ensure_ascii=False, separators=(",", ":")) for n in got] == [want[n["id"]] for n in got]
    assert sum("hgx-000a" in q["sql"] for q in seen.captured_queries) == 1, "the registration, nothing else"


@AGGREGATED.marks[0]
def test_a_node_s_aggregated_rows_are_the_rows_read_as_rows():
    """Column for column and type for type, once each side's JSON columns are decoded; a whole rate still a float."""
    from core.pipelined import overlapped
    from inventory.reads import nodes as listing

    everything_fleet()
    IBPort.objects.filter(pk=IBPort.objects.first().pk).update(rate_gbps=None)
    wiring = listing._Wiring.of(None)
    columns = wiring.card_columns
    card_json = [columns.index(c) for c in listing._CARD_JSON]
    port_json = [listing.PORT_FIELDS.index("counters")]

    def decoded(rows, page, json_columns) -> list[list]:
        return [[page.decode(v) if i in json_columns else v for i, v in enumerate(row)] for row in rows]

    def by_rows() -> dict[str, tuple]:
        with overlapped():
            sent = listing._PageSent(None, 1000, wiring)
        page = sent.received()
        return {n.name: _rows_of(page, n, card_json, port_json, decoded) for n in page.nodes}

    def aggregated() -> dict[str, tuple]:
        query = listing._Aggregated(wiring)
        with overlapped():
            sent = query._send((None, None))
        page = query._received(sent)
        return {n.name: _rows_of(page, n, card_json, port_json, decoded) for n in page.nodes}

    want, got = by_rows(), aggregated()
    assert got == want
    assert _types(got) == _types(want)
    rates = {type(row[listing.PORT_FIELDS.index("rate_gbps")]) for _, ports in got.values() for row in ports}
    assert rates == {float, type(None)}


def _rows_of(page, node, card_json, port_json, decoded) -> tuple[list, list]:
    cards = decoded(page.card_rows(page.cards.get(node.pk, ())), page, card_json)
    return cards, decoded(page.port_rows(page.ports.get(node.pk, ())), page, port_json)


def _types(nodes: dict[str, tuple]) -> set[str]:
    return {
        repr([[type(v) for v in row] for row in side]) for cards, ports in nodes.values() for side in (cards, ports)
    }


@pytest.mark.parametrize("in_database", [AGGREGATED, pytest.param(False, id="rows")])
def test_a_node_added_or_removed_while_the_listing_is_read_is_listed_at_most_once_and_every_other_node_once(
    in_database,
):
    """Pages by ranges of names read first (PostgreSQL) or by the last name listed (SQLite): a node added in a range
    already sent is missed, one added ahead is listed; a node removed ahead is not listed; the rest exactly once."""
    fleet("h100-hgx:9")
    names = sorted(Node.objects.values_list("name", flat=True))
    pages = node_pages_json(dumps, size=2, in_database=in_database)
    seen = [json.loads(t)["id"] for t in next(pages)]
    Node.objects.create(name="hgx-000a")  # behind the pages read
    Node.objects.create(name="hgx-007a")  # ahead
    Node.objects.filter(name="hgx-006").delete()  # ahead
    seen += [json.loads(t)["id"] for page in pages for t in page]
    assert len(seen) == len(set(seen))
    assert "hgx-007a" in seen and "hgx-006" not in seen and "hgx-000a" not in seen
    assert set(names) - {"hgx-006"} <= set(seen)
