"""Card health that acts: simulated faults reported through real ingestion, the reconciler moving replicas.

A fatal Xid holds the card and its replica moves (replacement first); repeated problems cordon
the node; neither is undone before a clean window; each action is an audit row, a finding,
and part of the node's detail.
"""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from agent.simulator import fleet as F
from core.models import AuditEntry, Finding
from inventory.models import CardHealthEvent, CardHold, Node
from inventory.writes import health, ingest
from observability import sweeps
from placement import reads as placement_reads
from placement.models import Replica, ReplicaState
from placement.writes.reconciler import reconcile
from tests.placement.dbfleet import fleet, gpu_profile, live, model, nodes_of, report_ready

pytestmark = pytest.mark.django_db


def report(sim: F.SimNode, now=None) -> None:
    ingest.ingest_report(Node.objects.get(name=sim.name), sim.report(), now or timezone.now())


def audit(action: str) -> list[AuditEntry]:
    return list(AuditEntry.objects.filter(actor="health", action=action).order_by("at"))


def test_a_fatal_xid_drains_the_replica_on_the_card_replacement_first():
    sims = fleet("h100-hgx:2")
    model("m", gpu_profile("h100-80g", gpus=4))
    Node.objects.filter(name="hgx-001").update(state="cordoned")
    reconcile()
    (old,) = live("m")
    report_ready(old)
    Node.objects.filter(name="hgx-001").update(state="ready")
    card = old.shards.get().gpu_indices[0]

    F.xid(sims["hgx-000"], card, 79)
    report(sims["hgx-000"])
    (hold,) = CardHold.objects.all()
    assert (hold.gpu_index, hold.reason) == (card, "Xid 79: GPU has fallen off the bus.")
    assert [a.target for a in audit("hold-card")] == [f"hgx-000 gpu {card}"]

    reconcile()
    new = Replica.objects.get(replaces=old)
    assert card not in new.shards.get().gpu_indices or nodes_of(new) != ["hgx-000"]
    assert Replica.objects.get(id=old.id).state == ReplicaState.READY, "the old one serves until the new is ready"
    explain = AuditEntry.objects.get(action="replace-replica")
    assert "is held: Xid 79" in explain.detail["reason"]
    report_ready(new)
    reconcile()
    assert Replica.objects.get(id=old.id).state == ReplicaState.STOPPING

    sweeps.sweep(timezone.now())
    assert Finding.objects.open().filter(kind="gpu_held", subject=f"hgx-000/gpu {card}").exists()
    detail = placement_reads.node_detail("hgx-000")
    assert detail["held_gpus"][0]["gpu"] == card
    assert [a["action"] for a in detail["health_actions"]] == ["hold-card"]
    assert "state" in detail and "gpus" in detail  # the existing fields are kept


def test_info_and_application_xids_act_on_nothing():
    sims = fleet("h100-hgx:1")
    for code in (13, 31, 43, 63):  # RESTART_APP and IGNORE in NVIDIA's catalogue
        F.xid(sims["hgx-000"], 0, code)
        report(sims["hgx-000"])
    assert CardHealthEvent.objects.count() == 4
    assert not CardHold.objects.exists()
    assert Node.objects.get(name="hgx-000").state == "ready"
    assert not AuditEntry.objects.filter(actor="health").exists()


def test_repeated_warnings_cordon_the_node_after_the_threshold_and_a_clean_window_undoes_it(monkeypatch):
    monkeypatch.setenv("LLMGW_HEALTH_CORDON_AFTER", "3")
    monkeypatch.setenv("LLMGW_HEALTH_WINDOW_S", "600")
    monkeypatch.setenv("LLMGW_HEALTH_CLEAN_S", "1800")
    sims = fleet("h100-hgx:1")
    sim, now = sims["hgx-000"], timezone.now()
    for i, gpu in enumerate((1, 2)):
        F.xid(sim, gpu, 92, at=(now + timedelta(seconds=i)).timestamp())
        report(sim, now + timedelta(seconds=i))
    assert Node.objects.get(name="hgx-000").state == "ready", "two are under the threshold"
    F.xid(sim, 1, 92, at=(now + timedelta(seconds=2)).timestamp())
    report(sim, now + timedelta(seconds=2))
    node = Node.objects.get(name="hgx-000")
    assert node.state == "cordoned"
    assert node.health_cordon.startswith("3 card health problems within 600 s")
    (cordon,) = audit("cordon")
    assert cordon.target == "hgx-000" and "Xid 92" in cordon.detail["reason"]
    assert not CardHold.objects.exists(), "warnings alone hold no card"

    report(sim, now + timedelta(seconds=1700))  # not yet clean for the window
    assert Node.objects.get(name="hgx-000").state == "cordoned"
    report(sim, now + timedelta(seconds=1900))
    node = Node.objects.get(name="hgx-000")
    assert (node.state, node.health_cordon) == ("ready", "")
    assert [a.action for a in AuditEntry.objects.filter(actor="health").order_by("at", "pk")] == [
        "cordon",
        "uncordon",
    ]


def test_a_recovered_card_is_not_put_back_before_the_clean_window(monkeypatch):
    monkeypatch.setenv("LLMGW_HEALTH_CLEAN_S", "3600")
    sims = fleet("h100-hgx:1")
    sim, now = sims["hgx-000"], timezone.now()
    F.ecc(sim, 4)  # a volatile uncorrectable ECC error: fatal
    report(sim, now)
    assert CardHold.objects.get().gpu_index == 4
    # The card is reset: its volatile counters are zero again, nothing shows.
    sim.gpus[4]["ecc"]["volatile"]["dram_uncorrectable"] = 0
    sim.version += 1
    report(sim, now + timedelta(seconds=60))
    assert CardHold.objects.filter(gpu_index=4).exists(), "clean, but not yet for the window"
    report(sim, now + timedelta(seconds=3700))
    assert not CardHold.objects.exists()
    assert [a.action for a in AuditEntry.objects.filter(actor="health").order_by("at", "pk")] == [
        "hold-card",
        "release-card",
    ]


def test_an_operators_cordon_is_not_lifted_by_health(monkeypatch):
    monkeypatch.setenv("LLMGW_HEALTH_CORDON_AFTER", "1")
    monkeypatch.setenv("LLMGW_HEALTH_CLEAN_S", "60")
    sims = fleet("h100-hgx:1")
    sim, now = sims["hgx-000"], timezone.now()
    Node.objects.filter(name="hgx-000").update(state="draining")
    F.xid(sim, 0, 92, at=now.timestamp())
    report(sim, now)
    assert Node.objects.get(name="hgx-000").state == "draining", "a draining node is left draining"
    report(sim, now + timedelta(seconds=120))
    assert Node.objects.get(name="hgx-000").state == "draining"


def test_a_tray_leaving_its_nvlink_domain_holds_no_card_the_domain_handles_it():
    sims = fleet("gb200-nvl72:1")
    tray = next(iter(sims.values()))
    F.tray_leave(tray)
    for gpu in tray.gpus:  # the words the agent's discovery gives a card that left (agent.discovery.gpus)
        gpu["fabric"]["problems"] = ["fabric registration in progress", "fabric health: Unhealthy"]
    report(tray)
    assert Node.objects.get(name=tray.name).gpus.exclude(fabric_problems=[]).exists(), "the fabric problem is stored"
    assert not CardHold.objects.exists() and not CardHealthEvent.objects.exists()
    assert Node.objects.get(name=tray.name).state == "ready"


@pytest.mark.django_db(transaction=True)
def test_two_reports_at_once_hold_the_card_once():
    sims = fleet("h100-hgx:1")
    sim = sims["hgx-000"]
    F.xid(sim, 6, 79)
    node = Node.objects.get(name="hgx-000")
    entries = sim.report()["gpus"]
    before = health.problems_before(node)
    errors, start = [], threading.Barrier(2)

    def review() -> None:
        try:
            start.wait()
            health.review(node, entries, before, timezone.now())
        except Exception as exc:  # noqa: BLE001 - collected for the assertion below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=review) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == []
    assert CardHold.objects.filter(gpu_index=6).count() == 1
    assert AuditEntry.objects.filter(action="hold-card").count() == 1
