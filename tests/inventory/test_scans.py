"""Physical fabrics from stored ports, a mislabelled node named, and topology scans handed out and kept."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.utils import timezone

from agent.simulator import fleet as F
from inventory.fabric_inventory import analyze_inventory, physical_fabric_ports
from inventory.models import FabricScan, IBPort, Node
from inventory.writes import ingest, scans
from tests.captures import all_captures

pytestmark = pytest.mark.django_db
NOW = timezone.now()


def store(nodes: list[F.SimNode]) -> None:
    for sim in nodes:
        node = Node.objects.create(name=sim.name, last_seen=NOW)
        ingest.ingest_report(node, sim.report(), NOW)


@pytest.fixture
def two_fabrics():
    nodes = F.build_fleet("h100-hgx:4@north,h100-hgx:4@south")
    # hgx-007 is cabled to south's switches but its configuration says north.
    F.mislabel(nodes[7], "north")
    store(nodes)
    return nodes


def test_declared_names_come_from_the_node_configuration():
    sim = F.build_fleet("h100-hgx:1@north")[0]
    report = sim.report()
    for port in report["ib_ports"]:
        del port["fabric"]  # a real agent declares fabrics per adapter, not per port
    node = Node.objects.create(name=sim.name)
    ingest.ingest_report(node, report, NOW)
    assert set(IBPort.objects.values_list("fabric", flat=True)) == {"north"}


def test_two_physical_fabrics_and_the_mislabelled_node_is_named(two_fabrics):
    report = analyze_inventory(NOW)
    assert len(report.physical) == 2
    named = {p.node for p in report.problems if p.kind in ("split_name", "merged_names")}
    assert named == {"hgx-007"}
    south = report.fabric_of("hgx-004")
    assert report.fabric_of("hgx-007") == south != report.fabric_of("hgx-000")


def test_the_fabrics_ports_as_read_are_the_analysis_ones(two_fabrics):
    """What the scan planner reads from the database: each physical fabric's ports, as the whole analysis has them."""
    IBPort.objects.filter(node__name="hgx-001", hca="mlx5_0").update(state="1: DOWN")  # a down port is on none
    IBPort.objects.filter(node__name="hgx-002", hca="mlx5_1").update(sm_guid="")  # nor one whose SM is unknown
    report = analyze_inventory(NOW)
    assert physical_fabric_ports() == {f.key: f.ports for f in report.physical}
    assert len(report.physical) == 2


def test_one_node_per_fabric_is_asked_to_scan(two_fabrics):
    assert len(scans.plan_scans(NOW)) == 2
    asked = {}
    for node in Node.objects.order_by("name"):
        request = scans.scan_for(node, NOW)
        if request:
            asked[request["fabric"]] = node.name
    assert len(asked) == 2 and set(asked.values()) == {"hgx-000", "hgx-004"}
    # Handed out and not answered: nobody is asked again meanwhile.
    assert scans.plan_scans(NOW + timedelta(seconds=5)) == []
    assert all(scans.scan_for(n, NOW + timedelta(seconds=5)) is None for n in Node.objects.all())


def test_an_upload_is_kept_and_a_failure_keeps_the_last_map(two_fabrics):
    node = Node.objects.get(name="hgx-000")
    scans.plan_scans(NOW)
    request = scans.scan_for(node, NOW)
    kept = scans.record_scan(node, {**request, "output": F.scan_capture(), "took_ms": 840}, NOW)
    assert kept.error == "" and kept.scanned_at == NOW and kept.took_ms == 840
    failed = scans.record_scan(node, {**request, "error": "ibnetdiscover not found"}, NOW + timedelta(hours=2))
    assert failed.error == "ibnetdiscover not found" and failed.output == F.scan_capture()
    assert failed.scanned_at == NOW and failed.attempted_at == NOW + timedelta(hours=2)
    garbled = scans.record_scan(node, {**request, "output": "this is not a map"}, NOW + timedelta(hours=3))
    assert "could not be read" in garbled.error and garbled.output == F.scan_capture()


def test_a_fresh_map_is_not_scanned_again_until_it_is_old_or_asked_for(two_fabrics):
    node = Node.objects.get(name="hgx-000")
    scans.plan_scans(NOW)
    request = scans.scan_for(node, NOW)
    scans.record_scan(node, {**request, "output": F.scan_capture()}, NOW)
    scans.plan_scans(NOW + timedelta(minutes=5))
    assert scans.scan_for(node, NOW + timedelta(minutes=5)) is None
    scans.request_scan(request["fabric"])
    assert request["fabric"] in scans.plan_scans(NOW + timedelta(minutes=6))
    assert scans.scan_for(node, NOW + timedelta(minutes=6))["fabric"] == request["fabric"]
    assert FabricScan.objects.get(fabric_key=request["fabric"]).pending_since is not None


def test_simulated_adapters_are_on_the_captured_map():
    from inventory.ibnetdiscover import normalize_guid, parse

    fabric_map = parse(F.scan_capture())
    sim = F.build_fleet("h100-hgx:2@north")
    guids = {normalize_guid(p["node_guid"]) for n in sim for p in n.ib_ports}
    assert guids <= set(fabric_map.cas), "each simulated adapter takes the place of a captured one"


@pytest.mark.parametrize("capture", all_captures("ibnetdiscover"), ids=lambda p: p.name)
def test_a_kept_map_reads_back_equal_to_the_parsed_one(capture):
    from inventory.ibnetdiscover import TopologyParseError, map_from_json, map_to_json, parse

    try:
        parsed = parse(capture.read_text(errors="replace"))
    except TopologyParseError:
        return  # a bad capture is refused at upload, and never kept
    assert map_from_json(json.loads(json.dumps(map_to_json(parsed)))) == parsed
