"""NVLink domains (what keeps a tray out) and InfiniBand fabrics (physical fabric, problems, a fabric's page)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from agent import nvlink_rules as R
from agent.simulator import fleet as F
from inventory.models import GPU, Node, SubnetManagerChange
from inventory.writes.ingest import ingest_report
from tests.api.fleet import ingest, ingest_fleet

pytestmark = pytest.mark.django_db


@pytest.fixture
def rack(db):
    return {s.name: s for s in ingest_fleet("gb200-nvl72:1,h100-hgx:1@north")}


def test_a_healthy_rack_is_one_domain_with_every_tray_in(operator, rack):
    report = operator.get("/api/v1/nvlink").json()
    [domain] = report["domains"]
    assert (domain["nodes_total"], domain["nodes_in"], domain["nodes_ready"]) == (18, 18, 18)
    assert (domain["gpus_total"], domain["gpus_joined"]) == (72, 72)
    assert report["unassigned"] == [], "an HGX's own NVSwitch is no domain, and nothing is trying to join one"
    nodes = operator.get("/api/v1/nodes").json()
    assert {n["nvlink_domain"] for n in nodes if n["id"].startswith("nvl72")} == {domain["key"]}
    assert "nvlink_domain" not in next(n for n in nodes if n["id"] == "hgx-000")


def test_what_keeps_trays_out_is_said_per_tray(operator, rack):
    F.tray_leave(rack["nvl72-00-tray-03"])
    F.imex_down(rack["nvl72-00-tray-05"])
    F.degrade(rack["nvl72-00-tray-07"], 2)
    for name in ("nvl72-00-tray-03", "nvl72-00-tray-05", "nvl72-00-tray-07"):
        ingest(rack[name])
    [domain] = operator.get("/api/v1/nvlink").json()["domains"]
    trays = {n["node"]: n for n in domain["nodes"]}
    assert domain["nodes_total"] == 18, "a tray that left is still listed under its rack"
    assert (domain["nodes_in"], domain["nodes_ready"], domain["gpus_joined"], domain["gpus_degraded"]) == (
        17,
        16,
        68,
        1,
    )
    left = trays["nvl72-00-tray-03"]
    assert not left["in_domain"] and left["out"][0] == "gpu 0 fabric state In Progress" and len(left["out"]) == 4
    assert trays["nvl72-00-tray-05"]["in_domain"] and trays["nvl72-00-tray-05"]["out"] == ["IMEX down"]
    amber = trays["nvl72-00-tray-07"]
    assert amber["ready"] and amber["warnings"] == ["gpu 2 NVLink bandwidth degraded (Degraded)"]
    assert "nvlink_domain" not in next(n for n in operator.get("/api/v1/nodes").json() if n["id"] == "nvl72-00-tray-03")


def test_a_tray_whose_registration_failed_is_listed_with_the_status_not_dropped(operator, rack):
    """Azure's capture: Completed, Insufficient Resources, an all-zero ClusterUUID: it names no rack, so unassigned."""
    GPU.objects.filter(node__name="nvl72-00-tray-04").update(
        fabric_status="Insufficient Resources", cluster_uuid="00000000-0000-0000-0000-000000000000", clique_id=0,
        domain=None,
    )  # fmt: skip
    report = operator.get("/api/v1/nvlink").json()
    [failed] = report["unassigned"]
    assert failed["node"] == "nvl72-00-tray-04" and not failed["in_domain"]
    assert failed["out"][0] == "gpu 0 fabric status Insufficient Resources"
    assert report["domains"][0]["nodes_total"] == 17


def test_a_report_spelling_the_fabric_in_another_case_joins_the_same_domain(operator, rack):
    """Completed/Success and the ClusterUUID compared case- and space-blind, as agent.nvlink_rules does."""
    sim = rack["nvl72-00-tray-02"]
    report = sim.report()
    for gpu in report["gpus"]:
        fabric = gpu["fabric"]
        fabric.update(state=" COMPLETED", status="success ", cluster_uuid=fabric["cluster_uuid"].upper())
    ingest_report(Node.objects.get(name=sim.name), report, timezone.now())
    [domain] = operator.get("/api/v1/nvlink").json()["domains"]
    assert (domain["nodes_total"], domain["nodes_in"], domain["gpus_joined"]) == (18, 18, 72)


def test_fabrics_group_ports_by_their_subnet_manager(operator, rack):
    report = operator.get("/api/v1/fabrics").json()
    north = next(p for p in report["physical"] if p["declared"] == ["north"])
    assert north["kind"] == "infiniband" and north["nodes"] == ["hgx-000"] and north["id"].startswith("sm-0x")
    assert report["nodes"]["hgx-000"] == {"fabric": north["key"], "why_not": None}


def test_a_fabric_page_has_its_problems_its_adapters_and_no_map_yet(operator, rack):
    report = operator.get("/api/v1/fabrics").json()
    north = next(p for p in report["physical"] if p["declared"] == ["north"])
    old = north["sm_guid"]
    for minutes in (30, 10):
        SubnetManagerChange.objects.create(
            node_id=_node_id("hgx-000"),
            hca="mlx5_0",
            port=1,
            old_sm_guid="0x1",
            new_sm_guid=old,
            at=timezone.now() - timedelta(minutes=minutes),
        )
        SubnetManagerChange.objects.create(
            node_id=_node_id("hgx-000"),
            hca="mlx5_0",
            port=1,
            old_sm_guid=old,
            new_sm_guid="0x1",
            at=timezone.now() - timedelta(minutes=minutes + 5),
        )
    page = operator.get(f"/api/v1/fabrics/{north['id']}/topology").json()
    assert page["key"] == north["key"] and len(page["live"]) == 8
    assert page["live"][0]["node"] == "hgx-000" and page["live"][0]["errors"] == {}
    assert "map" not in page and "No scan of this fabric has been uploaded" in page["map_note"]
    assert [p["kind"] for p in page["problems"]] == ["sm_flapping"]


def _node_id(name):
    from inventory.models import Node

    return Node.objects.get(name=name).pk


def test_an_unknown_fabric_is_a_404(operator, rack):
    answer = operator.get("/api/v1/fabrics/sm-0xdead/topology")
    assert answer.status_code == 404 and "ctl fabrics" in answer.json()["error"]


def test_a_scanned_fabric_is_drawn_with_the_clusters_adapters_on_it(operator, reader, rack):
    from inventory.models import Node
    from inventory.writes import scans

    north = next(p for p in operator.get("/api/v1/fabrics").json()["physical"] if p["declared"] == ["north"])
    node = Node.objects.get(name="hgx-000")
    scans.record_scan(
        node,
        {"fabric": north["key"], "hca": "mlx5_0", "port": 1, "output": F.scan_capture(), "took_ms": 900},
        timezone.now(),
    )
    page = operator.get(f"/api/v1/fabrics/{north['id']}/topology").json()
    assert page["map"]["counts"]["switches"] == 40 and "map_note" not in page
    ours = [h for h in page["map"]["hosts"] if h.get("node") == "hgx-000"]
    assert len(ours) == 8, "every adapter of the simulated node is marked on the captured map"
    assert page["scan"]["node"] == "hgx-000" and page["scan"]["error"] is None

    # A failed scan keeps the map and says when and why.
    scans.record_scan(node, {"fabric": north["key"], "error": "ibnetdiscover not found"}, timezone.now())
    page = operator.get(f"/api/v1/fabrics/{north['id']}/topology").json()
    assert page["map"]["counts"]["switches"] == 40
    assert "failed (ibnetdiscover not found)" in page["map_note"] and page["scan"]["error"]

    # Asking for a scan is a change: audited, and refused to a read-only token.
    assert reader.post(f"/api/v1/fabrics/{north['id']}/scan").status_code == 403
    answer = operator.post(f"/api/v1/fabrics/{north['id']}/scan")
    assert answer.status_code == 202 and answer.json()["fabric"] == north["key"]
    assert operator.post("/api/v1/fabrics/sm-0xdead/scan").status_code == 404


def test_a_tray_with_one_card_settled_alone_is_still_listed_whole(operator, rack):
    """The report skips nodes whose cards are all settled alone (nvlink_rules.SETTLED_ALONE), not such cards."""
    state, status, uuid = R.SETTLED_ALONE
    GPU.objects.filter(node__name="nvl72-00-tray-06", index=1).update(
        fabric_state=state, fabric_status=status, cluster_uuid=uuid, clique_id=0, domain=None
    )
    [domain] = operator.get("/api/v1/nvlink").json()["domains"]
    tray = next(n for n in domain["nodes"] if n["node"] == "nvl72-00-tray-06")
    assert [c["index"] for c in tray["cards"]] == [0, 1, 2, 3]
    assert not tray["in_domain"] and tray["out"] == ["gpu 1 joined no domain"]
    assert (domain["gpus_total"], domain["gpus_joined"]) == (72, 71)


def test_more_racks_and_boxes_take_no_more_queries(operator, rack, django_assert_max_num_queries):
    """The NVLink report reads in a fixed number of queries, however many racks and HGX boxes there are."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    operator.get("/api/v1/nvlink")  # the token's first use of the minute writes last_used_at
    with CaptureQueriesContext(connection) as seen:
        small = operator.get("/api/v1/nvlink").json()
    ingest_fleet("gb200-nvl72:2,h100-hgx:6@south", prefix="more-")
    with django_assert_max_num_queries(len(seen)):
        bigger = operator.get("/api/v1/nvlink").json()
    assert (len(small["domains"]), len(bigger["domains"])) == (1, 3)
    assert len(seen) <= 7  # two of them the account's permissions (core.access)
