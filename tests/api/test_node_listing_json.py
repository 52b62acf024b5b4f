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


def listed_pages(now, fields=None, size=None) -> list[list[str]]:
    return list(node_pages_json(dumps, now=now, fields=fields, size=size))


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


@pytest.mark.parametrize("fields", FIELDS, ids=lambda f: "all" if f is None else ",".join(sorted(f)))
def test_the_listing_is_the_json_of_the_views_it_replaced_page_by_page(fields):
    """The cards and ports aggregated by PostgreSQL into a text a node give the views' JSON."""
    everything_fleet()
    now = timezone.now()
    for size in (3, None):  # pages of three (cards shared across pages), and the default
        want = reference_pages(now, fields, size)
        got = listed_pages(now, fields, size)
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


def queries_a_page(size: int) -> tuple[int, list[int]]:
    """(queries up to the end of the first page, queries of each later page) for the listing in pages of ``size``."""
    with CaptureQueriesContext(connection) as seen:
        after = [len(seen) for _ in node_pages_json(dumps, size=size)]
    return after[0], [b - a for a, b in pairwise(after)]


def test_each_page_takes_the_same_queries_whatever_the_fleet_and_its_cards():
    """One a page (the nodes bring their cards and ports), for a page of CPU nodes as for one of 18 NVL72 trays."""
    per_page = 1
    fleet("h100-hgx:2,cpu:2")
    first_small, small = queries_a_page(2)
    fleet("gb200-nvl72:1,a100-mig:2")
    assert Node.objects.count() == 24
    first_big, big = queries_a_page(2)
    assert first_big == first_small, "the first page: the shards, the domains, its own"
    assert len(big) == 11 and len(small) == 1, "pages after the first"
    assert set(big) == set(small) == {per_page}


def test_the_whole_listing_takes_the_same_queries_for_six_nodes_as_for_thirty():
    fleet("h100-hgx:2,a100-mig:2,cpu:2")
    with CaptureQueriesContext(connection) as six:
        assert sum(len(p) for p in node_pages_json(dumps)) == 6
    ingest_fleet("gb200-nvl72:1,h100-hgx:6@south", prefix="b-")
    with CaptureQueriesContext(connection) as many:
        assert sum(len(p) for p in node_pages_json(dumps)) == 30
    assert len(many) == len(six), "one page either way: the same queries"


def test_a_node_s_aggregated_rows_are_its_rows_as_values_list_reads_them():
    """Column for column and type for type, JSON columns as their values; a whole rate still a float."""
    from core.pipelined import overlapped
    from inventory.reads import node_listing as listing

    everything_fleet()
    IBPort.objects.filter(pk=IBPort.objects.first().pk).update(rate_gbps=None)
    wiring = listing._Wiring.of(None)

    def by_rows() -> dict[str, tuple]:
        out = {}
        for node in Node.objects.all():
            cards = GPU.objects.filter(node=node).order_by("index").values_list(*wiring.card_columns)
            ports = IBPort.objects.filter(node=node).order_by("hca", "port").values_list(*listing.PORT_FIELDS)
            out[node.name] = ([list(r) for r in cards], [list(r) for r in ports])
        return out

    def aggregated() -> dict[str, tuple]:
        query = listing._Aggregated(wiring)
        with overlapped():
            sent = query._send((None, None))
        page = query._received(sent)
        return {
            n.name: (
                [list(r) for r in page.card_rows(page.cards.get(n.pk))],
                [list(r) for r in page.port_rows(page.ports.get(n.pk))],
            )
            for n in page.nodes
        }

    want, got = by_rows(), aggregated()
    assert got == want
    assert _types(got) == _types(want)
    rates = {type(row[listing.PORT_FIELDS.index("rate_gbps")]) for _, ports in got.values() for row in ports}
    assert rates == {float, type(None)}


def _types(nodes: dict[str, tuple]) -> set[str]:
    return {
        repr([[type(v) for v in row] for row in side]) for cards, ports in nodes.values() for side in (cards, ports)
    }


def test_a_node_added_or_removed_while_the_listing_is_read_is_listed_at_most_once_and_every_other_node_once():
    """Pages by ranges of names read first: a node added in a range already sent is missed, one added ahead is
    listed; a node removed ahead is not listed; the rest exactly once."""
    fleet("h100-hgx:9")
    names = sorted(Node.objects.values_list("name", flat=True))
    pages = node_pages_json(dumps, size=2)
    seen = [json.loads(t)["id"] for t in next(pages)]
    Node.objects.create(name="hgx-000a")  # behind the pages read
    Node.objects.create(name="hgx-007a")  # ahead
    Node.objects.filter(name="hgx-006").delete()  # ahead
    seen += [json.loads(t)["id"] for page in pages for t in page]
    assert len(seen) == len(set(seen))
    assert "hgx-007a" in seen and "hgx-006" not in seen and "hgx-000a" not in seen
    assert set(names) - {"hgx-006"} <= set(seen)
