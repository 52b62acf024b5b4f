"""Each fleet metric's value on a simulated fleet, driven by the simulator's reports and faults through ingestion."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from agent.simulator import fleet as F
from catalog.models import CatalogModel, Profile
from core.models import Finding
from inventory.models import Node
from observability import metrics
from placement.models import Replica, Shard
from tests.observability.fleet import Scrape, ingest_fleet, report_again, scrape_fleet

pytestmark = pytest.mark.django_db

NOW = timezone.now()
SPEC = "gb200-nvl72:1,h100-hgx:2,a100-mig:1,cpu:1"
TRAYS = [f"nvl72-00-tray-{t:02d}" for t in range(18)]


@pytest.fixture
def sims():
    return ingest_fleet(SPEC, NOW)


def joined(scrape: Scrape) -> dict[tuple[str, str], float]:
    return {(n, g): v for (n, g, _d), v in scrape.by("llmgw_gpu_nvlink_joined", "node", "gpu", "domain").items()}


def test_every_card_of_the_rack_is_joined_and_nothing_else_is_counted(sims):
    scrape = scrape_fleet(NOW)
    values = scrape.by("llmgw_gpu_nvlink_joined", "node", "gpu", "domain")
    assert len(values) == 72 and set(values.values()) == {1.0}
    assert {n for n, _, _ in values} == set(TRAYS), "HGX cards (a zero ClusterUUID) and MIG instances have no domain"
    assert len({d for _, _, d in values}) == 1
    assert set(scrape.by("llmgw_gpu_nvlink_degraded", "node", "gpu").values()) == {0.0}


def test_a_tray_leaving_its_domain_sets_exactly_its_cards_to_0(sims):
    before = joined(scrape_fleet(NOW))
    F.tray_leave(sims["nvl72-00-tray-03"])
    report_again([sims["nvl72-00-tray-03"]], NOW)
    after = joined(scrape_fleet(NOW))
    assert set(after) == set(before), "the series stay; their values change"
    changed = {key for key in after if after[key] != before[key]}
    assert changed == {("nvl72-00-tray-03", str(i)) for i in range(4)}
    assert all(after[key] == 0.0 for key in changed)

    F.tray_rejoin(sims["nvl72-00-tray-03"])
    report_again([sims["nvl72-00-tray-03"]], NOW)
    assert joined(scrape_fleet(NOW)) == before


def test_a_degraded_card_is_joined_and_degraded(sims):
    F.degrade(sims["nvl72-00-tray-05"], 2)
    report_again([sims["nvl72-00-tray-05"]], NOW)
    scrape = scrape_fleet(NOW)
    degraded = {k: v for k, v in scrape.by("llmgw_gpu_nvlink_degraded", "node", "gpu").items() if v}
    assert degraded == {("nvl72-00-tray-05", "2"): 1.0}
    assert joined(scrape)[("nvl72-00-tray-05", "2")] == 1.0


def test_imex_up_per_node_of_a_domain(sims):
    F.imex_down(sims["nvl72-00-tray-07"])
    report_again([sims["nvl72-00-tray-07"]], NOW)
    imex = {n: v for (n,), v in scrape_fleet(NOW).by("llmgw_imex_up", "node").items()}
    assert set(imex) == set(TRAYS), "nodes outside any domain, without IMEX, have no series"
    assert [n for n, v in imex.items() if v == 0.0] == ["nvl72-00-tray-07"]


def test_node_up_state_and_heartbeat_age(sims):
    Node.objects.filter(name="hgx-001").update(reachable=False, state="cordoned")
    Node.objects.filter(name="cpu-00").update(lost=True, reachable=False)
    Node.objects.filter(name="mig-00").update(last_seen=NOW - timedelta(seconds=42))
    Node.objects.filter(name="hgx-000").update(last_seen=None)
    scrape = scrape_fleet(NOW)
    up = scrape.by("llmgw_node_up", "node", "state")
    assert len(up) == len(sims)
    assert up[("hgx-001", "cordoned")] == 0.0 and up[("cpu-00", "ready")] == 0.0
    assert up[("nvl72-00-tray-00", "ready")] == 1.0
    age = {n: v for (n,), v in scrape.by("llmgw_node_heartbeat_age_seconds", "node").items()}
    assert age["mig-00"] == pytest.approx(42.0) and age["nvl72-00-tray-00"] == pytest.approx(0.0)
    assert "hgx-000" not in age, "never heard from: no age rather than a made-up one"


def test_gpus_by_class_and_state(sims):
    model = CatalogModel.objects.create(name="llama")
    replica = Replica.objects.create(model=model, profile_name="hgx", state="ready")
    Shard.objects.create(replica=replica, node=Node.objects.get(name="hgx-000"), gpu_indices=[0, 1, 2, 3])
    mig = Replica.objects.create(model=model, profile_name="mig", state="starting")
    Shard.objects.create(replica=mig, node=Node.objects.get(name="mig-00"), gpu_indices=[1001])
    F.gpu_lost(sims["hgx-001"], 5)
    report_again([sims["hgx-001"]], NOW)
    gpus = scrape_fleet(NOW).by("llmgw_gpus", "class", "state")
    assert gpus == {
        ("gb200-185g", "used"): 0.0,
        ("gb200-185g", "free"): 72.0,
        ("gb200-185g", "unhealthy"): 0.0,
        ("gb200-185g", "held"): 0.0,
        ("gb200-185g", "unavailable"): 0.0,
        ("h100-80g", "used"): 4.0,
        ("h100-80g", "free"): 11.0,
        ("h100-80g", "unhealthy"): 1.0,
        ("h100-80g", "held"): 0.0,
        ("h100-80g", "unavailable"): 0.0,
        ("a100-80g-mig-1g.20gb", "used"): 1.0,
        ("a100-80g-mig-1g.20gb", "free"): 3.0,
        ("a100-80g-mig-1g.20gb", "unhealthy"): 0.0,
        ("a100-80g-mig-1g.20gb", "held"): 0.0,
        ("a100-80g-mig-1g.20gb", "unavailable"): 0.0,
    }


def test_replicas_by_model_and_state_and_parked_models(sims):
    llama = CatalogModel.objects.create(name="llama", min_replicas=3, max_replicas=4)
    Profile.objects.create(model=llama, name="hgx", engine="vllm", gpu_class="h100-80g")
    CatalogModel.objects.create(name="broken", parked_at=NOW, parked_error="CUDA out of memory")
    for state in ("ready", "ready", "starting", "failed"):
        Replica.objects.create(model=llama, profile_name="hgx", state=state)
    scrape = scrape_fleet(NOW)
    replicas = scrape.by("llmgw_replicas", "model", "state")
    assert replicas[("llama", "ready")] == 2.0 and replicas[("llama", "starting")] == 1.0
    assert replicas[("llama", "failed")] == 1.0 and replicas[("llama", "pending")] == 0.0
    assert replicas[("broken", "ready")] == 0.0, "every state of every model, so a series drops to 0, not away"
    assert scrape.by("llmgw_model_parked", "model") == {("broken",): 1.0, ("llama",): 0.0}
    assert scrape.by("llmgw_model_min_replicas", "model") == {("broken",): 1.0, ("llama",): 3.0}


def test_open_findings_by_kind_and_severity(sims):
    Finding.objects.create(kind="node_silent", subject="a", message="m", severity="critical")
    Finding.objects.create(kind="node_silent", subject="b", message="m", severity="critical")
    Finding.objects.create(kind="node_silent", subject="c", message="m", severity="critical", resolved_at=NOW)
    assert scrape_fleet(NOW).by("llmgw_findings_open", "kind", "severity") == {("node_silent", "critical"): 2.0}


def test_the_scrape_costs_the_same_queries_for_any_fleet_size(django_assert_max_num_queries):
    ingest_fleet("h100-hgx:1", NOW)
    with CaptureQueriesContext(connection) as small:
        scrape_fleet(NOW)
    ingest_fleet("gb200-nvl72:2", NOW)
    with CaptureQueriesContext(connection) as large:
        scrape_fleet(NOW)
    # Fourteen: the set-aside usage count (issue #18) is one query more, the same for any fleet; the devices by
    # class are counted in the database as the summary counts them, in a savepoint of their own with PostgreSQL's
    # JIT off (savepoint, SET LOCAL, the count, release: three more than the shard query they replace).
    # The autoscaler's figures add three (desired with the catalog, ready replicas, the load rows) and the
    # budgets' used ratio one: eighteen, the same for any fleet.
    assert len(large) == len(small) <= 18


def test_label_values_are_bounded(sims):
    """Only names the fleet and catalog define, classes, states and domain keys: nothing per request."""
    CatalogModel.objects.create(name="llama")
    scrape = scrape_fleet(NOW)
    nodes = set(sims)
    allowed = {
        "node": nodes,
        "state": {"ready", "cordoned", "draining", *metrics.GPU_STATES, *metrics.REPLICA_STATES},
        "class": {"gb200-185g", "h100-80g", "a100-80g-mig-1g.20gb"},
        "model": {"llama"},
        "le": {str(float(b)) for b in metrics.RECONCILE_BUCKETS} | {"+Inf"},
        "source": set(metrics.SOURCES),  # the extra sources registered in code, e.g. the gateway
    }

    for family in scrape.families.values():
        for sample in family.samples:
            for key, value in sample.labels.items():
                if key == "gpu":
                    assert value.isdigit() or "/mig" in value
                elif key == "domain":
                    assert value.count("/") == 1
                else:
                    assert value in allowed[key], (family.name, key, value)


# --- the reconcile histogram ----------------------------------------------------------------------------------------


def test_reconcile_durations_land_in_a_histogram_every_process_reads():
    for seconds in (0.02, 0.3, 0.4, 100.0):
        metrics.observe_reconcile(seconds)
    scrape = scrape_fleet(NOW)  # a fresh collector reads from the database, as another process would
    buckets = {s.labels["le"]: s.value for s in scrape.samples("llmgw_reconcile_seconds_bucket")}
    assert buckets["0.01"] == 0 and buckets["0.025"] == 1 and buckets["0.5"] == 3 and buckets["60.0"] == 3
    assert buckets["+Inf"] == 4
    assert scrape.value("llmgw_reconcile_seconds_count") == 4
    assert scrape.value("llmgw_reconcile_seconds_sum") == pytest.approx(100.72)


def test_an_empty_histogram_is_all_zeros():
    scrape = scrape_fleet(NOW)
    assert scrape.value("llmgw_reconcile_seconds_count") == 0
    assert {s.value for s in scrape.samples("llmgw_reconcile_seconds_bucket")} == {0.0}


class FakeTask:
    name = "placement.tasks.reconcile"


def run_task(retval=None, *, observes_itself: bool = False, name: str = "placement.tasks.reconcile") -> None:
    """The Celery signals of one task run, as the worker sends them."""
    from observability import tasks

    task = FakeTask()
    task.name = name
    tasks._started(task=task, task_id="t1")
    if observes_itself:
        metrics.observe_reconcile(0.2)
    tasks._finished(task=task, task_id="t1", state="SUCCESS", retval=retval)


def test_each_reconcile_task_run_is_timed_once():
    run_task({"placed": 1})
    assert scrape_fleet(NOW).value("llmgw_reconcile_seconds_count") == 1
    run_task({"skipped": "another worker holds the lock"})
    assert scrape_fleet(NOW).value("llmgw_reconcile_seconds_count") == 1, "a skipped run reconciled nothing"
    run_task({"placed": 0}, observes_itself=True)
    assert scrape_fleet(NOW).value("llmgw_reconcile_seconds_count") == 2, "not counted twice"
    run_task(name="observability.tasks.tick")
    assert scrape_fleet(NOW).value("llmgw_reconcile_seconds_count") == 2


# --- the gateway's extension point ----------------------------------------------------------------------------------


def test_an_extra_source_is_scraped_and_a_broken_one_costs_only_itself(monkeypatch):
    from prometheus_client.core import CounterMetricFamily

    def gateway():
        family = CounterMetricFamily("llmgw_gateway_requests", "Requests.", labels=["model", "status"])
        family.add_metric(["llama", "200"], 12.0)
        yield family

    def broken():
        raise RuntimeError("redis is down")

    monkeypatch.setattr(metrics, "SOURCES", {})
    metrics.register_source("gateway", gateway)
    metrics.register_source("usage", broken)
    scrape = scrape_fleet(NOW)
    assert scrape.value("llmgw_gateway_requests_total", model="llama", status="200") == 12.0
    assert scrape.by("llmgw_metrics_source_up", "source") == {("gateway",): 1.0, ("usage",): 0.0}
    assert "llmgw_gpus" in scrape.families


def test_the_scrape_leaves_the_cycle_collector_as_it_found_it(sims):
    import gc

    assert gc.isenabled()
    assert b"llmgw_gpus" in metrics.exposition()
    assert gc.isenabled()
