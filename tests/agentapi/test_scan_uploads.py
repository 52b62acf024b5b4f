"""A topology scan is taken only from the node it was assigned to, checked field by field, and parsed once.

Before, any node could upload a map for any fabric (and clear an operator's
request to rescan it), a non-integer port or a long fabric key was a 500, and
every page view parsed the stored text again.
"""

from __future__ import annotations

import pytest
from django.test import Client
from django.utils import timezone

from agent.simulator import fleet as F
from inventory import ibnetdiscover
from inventory.models import FabricScan, Node
from inventory.reads import topology
from inventory.topology import build_view
from inventory.writes import scans
from tests.agentapi.agenthttp import post
from tests.placement.dbfleet import credential
from tests.placement.dbfleet import fleet as dbfleet

pytestmark = pytest.mark.django_db


@pytest.fixture
def assigned():
    """Two fabrics, each scan assigned and handed out: {fabric key: node name}."""
    dbfleet("h100-hgx:2@north,h100-hgx:2@south")
    now = timezone.now()
    scans.plan_scans(now)
    out = {}
    for node in Node.objects.order_by("name"):
        request = scans.scan_for(node, now)
        if request:
            out[request["fabric"]] = node.name
    assert len(out) == 2
    return out


def upload(name: str, body) -> dict:
    answer = post(Client(), "scan", body, credential(name))
    assert answer.status_code < 500, answer.content
    return {"status": answer.status_code, **answer.json()}


def rows() -> list[dict]:
    return list(FabricScan.objects.order_by("fabric_key").values())


def test_the_assigned_node_uploads_its_fabrics_map_and_it_is_parsed_once(assigned, monkeypatch):
    (key, name), _ = assigned.items()
    answer = upload(name, {"fabric": key, "hca": "mlx5_9", "port": "seven", "output": F.scan_capture(), "took_ms": 5})
    assert answer == {"status": 200, "fabric": key, "kept": True, "error": None}
    kept = FabricScan.objects.get(fabric_key=key)
    assert kept.fabric_map and kept.port != "seven" and kept.hca != "mlx5_9", "the assignment's adapter and port"
    expected = drawn_from_text(key, F.scan_capture())

    def no_parsing(*args, **kwargs):
        raise AssertionError("a page view parsed the scan again")

    monkeypatch.setattr(ibnetdiscover, "parse", no_parsing)
    monkeypatch.setattr(scans, "parse", no_parsing)
    view = topology(key)
    assert view["map"]["counts"]["switches"] > 0 and view["map"]["counts"]["ours"] > 0
    assert view["map"] == expected, "the kept map draws exactly what the text does"


def drawn_from_text(key: str, text: str) -> dict:
    """The map as it was drawn when each page view parsed the text."""
    view = topology(key)
    hosts = {p["node_guid"]: (p["node"], p["hca"]) for p in view["live"] if p.get("node_guid")}
    return build_view(ibnetdiscover.parse(text), hosts)


def test_another_node_cannot_overwrite_a_fabrics_map_or_clear_a_rescan_request(assigned):
    (key, owner), (other_key, other) = assigned.items()
    assert upload(owner, {"fabric": key, "output": F.scan_capture()})["status"] == 200
    scans.request_scan(key)
    before = rows()
    for name, fabric in ((other, key), (owner, other_key), (owner, "sm:0x0000000000000bad")):
        answer = upload(name, {"fabric": fabric, "output": F.scan_capture()})
        assert answer["status"] == 409 and "was not asked to scan" in answer["error"]
    assert rows() == before, "the map and the operator's request are as they were"


def test_an_answer_is_taken_once(assigned):
    (key, name), _ = assigned.items()
    assert upload(name, {"fabric": key, "error": "ibnetdiscover not found"})["status"] == 200
    before = rows()
    assert upload(name, {"fabric": key, "output": F.scan_capture()})["status"] == 409
    assert rows() == before


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"fabric": "f" * 101, "output": "x"}, "no fabric key is longer than 100"),
        ({"fabric": "sm:x", "output": 5}, "output and error must be text"),
        ({"fabric": "sm:x"}, "needs the output of ibnetdiscover"),
        ({"fabric": "sm:x", "output": "x", "took_ms": "fast"}, "scan.took_ms must be a whole number"),
        ({"fabric": "sm:x", "output": "x", "took_ms": 2**31}, "scan.took_ms must be a whole number"),
        ({"fabric": "sm:x", "error": "bad\x00"}, "scan.error: 'bad\\x00' holds a NUL"),
        ({"fabric": "sm:\ud800", "output": "x"}, "scan.fabric: 'sm:\\ud800' holds a lone surrogate"),
        (["sm:x"], "a scan upload is an object"),
    ],
)
def test_a_malformed_upload_is_a_400_with_a_sentence(assigned, body, words):
    (_, name), _ = assigned.items()
    before = rows()
    answer = upload(name, body)
    assert answer["status"] == 400 and words in answer["error"]
    assert rows() == before
