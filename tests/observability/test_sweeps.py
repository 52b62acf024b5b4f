"""Doctor sweeps: each finding appears when its cause does, stays while it lasts, and resolves when it clears."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from agent.simulator import fleet as F
from catalog.models import CatalogModel
from core.locks import exclusive
from core.models import Finding
from inventory import health_rules
from inventory.models import Node
from inventory.writes.ingest import ingest_report
from llmgw.celery import beat_schedule
from observability import sweeps
from observability.findings import open_findings
from observability.tasks import DOCTOR_SWEEP_TASK, doctor_sweep
from tests.observability.fleet import ingest_fleet, report_again

pytestmark = pytest.mark.django_db

T0 = timezone.now()
SPEC = "gb200-nvl72:1@north,h100-hgx:2@north,cpu:1"
TRAY = "nvl72-00-tray-03"


def at(seconds: float):
    return T0 + timedelta(seconds=seconds)


@pytest.fixture
def sims():
    return ingest_fleet(SPEC, T0)


def sweep(seconds: float = 0) -> sweeps.Recorded:
    return sweeps.sweep(at(seconds))


def opened(kind: str) -> dict[str, Finding]:
    return {f.subject: f for f in Finding.objects.open().filter(kind=kind)}


def test_a_healthy_fleet_has_no_finding(sims):
    result = sweep()
    assert not result.changed and Finding.objects.count() == 0 and open_findings() == []


def test_a_domain_only_partly_joined_opens_and_resolves(sims):
    F.tray_leave(sims[TRAY])
    report_again([sims[TRAY]], at(1))
    assert sweep(2).opened == [("domain_partly_joined", next(iter(opened("domain_partly_joined"))))]
    (finding,) = opened("domain_partly_joined").values()
    assert f"4 of 72 cards have not joined ({TRAY}: gpus 0, 1, 2, 3)" in finding.message

    sweep(62)
    finding.refresh_from_db()
    assert finding.first_seen == at(2) and finding.last_seen == at(62) and finding.open

    F.tray_rejoin(sims[TRAY])
    report_again([sims[TRAY]], at(70))
    assert sweep(75).resolved == [("domain_partly_joined", finding.subject)]
    finding.refresh_from_db()
    assert finding.resolved_at == at(75) and not opened("domain_partly_joined")


def test_imex_down_on_a_node_of_a_domain(sims):
    F.imex_down(sims[TRAY])
    report_again([sims[TRAY]], at(1))
    sweep(2)
    assert set(opened("imex_down")) == {TRAY}
    assert "IMEX is down on nvl72-00-tray-03" in opened("imex_down")[TRAY].message
    F.imex_up(sims[TRAY])
    report_again([sims[TRAY]], at(3))
    sweep(4)
    assert not opened("imex_down")


def test_nodes_of_one_domain_on_two_infiniband_fabrics(sims):
    odd = sims["nvl72-00-tray-17"]
    for port in odd.ib_ports:
        port["sm_guid"], port["fabric"] = "0x00000000000000aa", "south"
    odd.version += 1
    report_again([odd], at(1))
    sweep(2)
    (finding,) = opened("domain_split_fabrics").values()
    assert "sit on 2 InfiniBand fabrics" in finding.message and "nvl72-00-tray-17" in finding.message
    original = F.build_fleet(SPEC)[17]
    odd.ib_ports = original.ib_ports
    report_again([odd], at(3))
    sweep(4)
    assert not opened("domain_split_fabrics")


def move_sm(sims, nodes: list[str], guid: str, seconds: float) -> None:
    for name in nodes:
        for port in sims[name].ib_ports:
            port["sm_guid"] = guid
    report_again([sims[n] for n in nodes], at(seconds))


def test_a_subnet_manager_change_warns_flapping_is_critical_and_it_clears_after_a_day(sims):
    north = [n for n in sims if not n.startswith("cpu")]
    original = sims[north[0]].ib_ports[0]["sm_guid"]
    move_sm(sims, north, "0x00000000000000bb", 10)
    sweep(20)
    assert set(opened("sm_changed")) == {"north"}, "named after the fabric, not the SM that changed"
    (finding,) = opened("sm_changed").values()
    assert finding.severity == "warning" and "changed once" in finding.message
    move_sm(sims, north, original, 600)  # and back: a flap
    sweep(610)
    finding.refresh_from_db()
    assert finding.severity == "critical" and "flapping" in finding.message and finding.first_seen == at(20)
    sweep(25 * 3600)
    finding.refresh_from_db()
    assert not finding.open


def test_an_unhealthy_gpu_opens_a_finding_of_its_own(sims):
    F.gpu_lost(sims["hgx-001"], 5)
    report_again([sims["hgx-001"]], at(1))
    sweep(2)
    assert set(opened("gpu_unhealthy")) == {"hgx-001/gpu 5"}
    assert "GPU is lost" in opened("gpu_unhealthy")["hgx-001/gpu 5"].message
    sims["hgx-001"].gpus[5]["health"] = []
    sims["hgx-001"].version += 1
    report_again([sims["hgx-001"]], at(3))
    sweep(4)
    assert not opened("gpu_unhealthy")


def test_rising_memory_counters_are_a_finding_a_settled_count_is_none(sims):
    hgx = sims["hgx-001"]
    assert hgx.gpus[2]["ecc"]["aggregate"]["dram_correctable"] == 0
    hgx.gpus[2]["ecc"]["aggregate"]["dram_correctable"] = 3
    hgx.version += 1
    report_again([hgx], at(1))
    sweep(2)
    finding = opened("gpu_memory_rising")["hgx-001/gpu 2"]
    assert "aggregate dram_correctable 0 → 3" in finding.message and finding.severity == "warning"
    assert not opened("gpu_unhealthy")  # correctable errors are no fault: the card keeps its work
    report_again([hgx], at(60))  # the same counts again: no new rise, the first is still news
    sweep(61)
    assert set(opened("gpu_memory_rising")) == {"hgx-001/gpu 2"}
    sweep(1 + health_rules.RISING_WINDOW_S + 1)  # settled for a day: a fact, no longer a finding
    assert not opened("gpu_memory_rising")
    finding.refresh_from_db()
    assert not finding.open


def test_a_silent_node_warns_then_turns_critical_when_lost_and_clears_when_back(sims):
    Node.objects.filter(name="cpu-00").update(reachable=False, unreachable_since=at(1))
    sweep(2)
    (finding,) = opened("node_silent").values()
    assert finding.severity == "warning" and "unreachable" in finding.message
    Node.objects.filter(name="cpu-00").update(lost=True)
    sweep(90)
    finding.refresh_from_db()
    assert finding.severity == "critical" and "lost" in finding.message and finding.first_seen == at(2)
    Node.objects.filter(name="cpu-00").update(lost=False, reachable=True, unreachable_since=None)
    sweep(100)
    assert not opened("node_silent")


def test_a_parked_model(sims):
    model = CatalogModel.objects.create(name="llama", parked_at=at(0), parked_error="Traceback…\nCUDA out of memory")
    sweep(1)
    (finding,) = opened("model_parked").values()
    assert finding.severity == "critical" and finding.message.endswith(
        "CUDA out of memory. Fix the cause, then unpark it (or scale it)."
    )
    CatalogModel.objects.filter(pk=model.pk).update(parked_at=None)
    sweep(2)
    assert not opened("model_parked")


def test_a_finding_that_comes_back_is_a_new_one_and_history_stays(sims):
    Node.objects.filter(name="cpu-00").update(reachable=False)
    sweep(1)
    Node.objects.filter(name="cpu-00").update(reachable=True)
    sweep(2)
    Node.objects.filter(name="cpu-00").update(reachable=False)
    sweep(3)
    rows = list(Finding.objects.filter(kind="node_silent").order_by("first_seen"))
    assert [(r.first_seen, r.resolved_at) for r in rows] == [(at(1), at(2)), (at(3), None)]


def test_sweeping_twice_changes_nothing_but_last_seen(sims):
    F.gpu_lost(sims["hgx-000"], 0)
    report_again([sims["hgx-000"]], at(1))
    first = sweep(2)
    again = sweep(2)
    assert first.opened and not again.changed and again.still_open == 1
    assert Finding.objects.count() == 1


def queries_of_a_sweep(seconds: float) -> int:
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as seen:
        sweep(seconds)
    return len(seen)


def test_a_sweep_takes_the_same_queries_however_many_nodes_and_findings(sims):
    """No query per node, card or finding: a bigger fleet with ten times the findings sweeps in as many."""
    F.gpu_lost(sims["hgx-000"], 0)
    report_again([sims["hgx-000"]], at(1))
    sweep(2)
    few = queries_of_a_sweep(3)  # refreshing one open finding
    more = [s for s in F.build_fleet("h100-hgx:4@north,a100-mig:2", prefix="more-")]
    for sim in more:
        ingest_report(Node.objects.create(name=sim.name, last_seen=at(4)), sim.report(), at(4))
        if sim.kind == "h100-hgx":
            F.gpu_lost(sim, 1)
            F.gpu_lost(sim, 2)
    report_again([s for s in more if s.kind == "h100-hgx"], at(5))
    sweep(6)
    assert Finding.objects.open().count() >= 9
    assert queries_of_a_sweep(7) == few


def test_open_findings_for_the_other_pieces(sims):
    CatalogModel.objects.create(name="llama", parked_at=at(0))
    Node.objects.filter(name="cpu-00").update(reachable=False)
    sweep(5)
    found = open_findings()
    assert [f["kind"] for f in found] == ["model_parked", "node_silent"], "critical first"
    assert set(found[0]) == {"kind", "subject", "message", "severity", "first_seen", "last_seen"}
    assert found[1]["severity"] == "warning" and found[1]["first_seen"] == at(5)


def test_the_sweep_runs_every_minute_from_beat():
    entry = beat_schedule({})["doctor"]
    assert entry["task"] == DOCTOR_SWEEP_TASK and entry["schedule"] == 60.0
    assert beat_schedule({"LLMGW_EVERY_DOCTOR": "15"})["doctor"]["schedule"] == 15.0


def test_the_task_records_findings(sims):
    Node.objects.filter(name="cpu-00").update(reachable=False)
    assert doctor_sweep() == {"opened": 1, "resolved": 0, "open": 0}
    assert doctor_sweep() == {"opened": 0, "resolved": 0, "open": 1}


@pytest.mark.django_db(transaction=True)
def test_a_sweep_never_runs_twice_at_once():
    Node.objects.create(name="quiet", reachable=False)
    holding, release = threading.Event(), threading.Event()

    def other_worker():
        try:
            with exclusive(DOCTOR_SWEEP_TASK) as held:
                assert held
                holding.set()
                release.wait(10)
        finally:
            connection.close()

    worker = threading.Thread(target=other_worker)
    worker.start()
    try:
        assert holding.wait(10)
        assert doctor_sweep() == {"skipped": "another worker holds the lock"}
        assert Finding.objects.count() == 0
    finally:
        release.set()
        worker.join()
    assert doctor_sweep()["opened"] == 1
