"""The reconciler over time: drains, crash loops, idleness, stale profiles, lost nodes, its lock, idempotence.

Agents are played by heartbeats sent to the real endpoint, so the shard
states reach the rows the way they do in production.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from catalog import writes as service
from catalog.models import CatalogModel
from core.locks import exclusive
from inventory.models import Node
from placement import assignments, tasks
from placement.models import Demand, PlacementExplanation, Replica, ReplicaState, Shard
from placement.writes import demand
from placement.writes.reconciler import reconcile
from tests.placement.dbfleet import (
    fleet,
    gpu_profile,
    heartbeat,
    live,
    model,
    nodes_of,
    replicas,
    report_ready,
    shard_entry,
)

pytestmark = pytest.mark.django_db

H100 = gpu_profile("h100-80g", gpus=8)


def node_id(name: str) -> int:
    return Node.objects.get(name=name).pk


def ready(model_name: str) -> list[Replica]:
    return replicas(model_name, ReplicaState.READY)


def test_a_drain_starts_the_replacement_before_stopping_the_old_one():
    fleet("h100-hgx:2")
    model("m", H100)
    Node.objects.filter(name="hgx-001").update(state="cordoned")
    reconcile()
    (old,) = live("m")
    report_ready(old)
    Node.objects.filter(name="hgx-001").update(state="ready")
    Node.objects.filter(name="hgx-000").update(state="draining")

    reconcile()
    new = Replica.objects.get(replaces=old)
    assert nodes_of(new) == ["hgx-001"]
    # The old replica is still serving, and still told to run.
    assert [r.id for r in ready("m")] == [old.id]
    assert [s["replica"] for s in assignments.for_node(node_id("hgx-000"))] == [old.id]

    reconcile()  # the replacement is not ready yet: nothing stops
    assert [r.id for r in ready("m")] == [old.id]
    heartbeat("hgx-001", [shard_entry(new, "starting")])
    reconcile()
    assert Replica.objects.get(id=old.id).state == ReplicaState.READY

    report_ready(new)
    assert {r.id for r in ready("m")} == {old.id, new.id}, "both serve for a moment: no gap"
    reconcile()
    assert Replica.objects.get(id=old.id).state == ReplicaState.STOPPING
    assert [r.id for r in ready("m")] == [new.id]
    assert assignments.for_node(node_id("hgx-000")) == []

    # The old node still reports the shard while it stops it; once it no longer does, the row goes.
    heartbeat("hgx-000", [shard_entry(old, "stopping")])
    reconcile()
    assert Replica.objects.filter(id=old.id).exists()
    heartbeat("hgx-000", [])
    reconcile()
    assert not Replica.objects.filter(id=old.id).exists()
    assert [r.id for r in live("m")] == [new.id]


def test_a_crash_looping_model_is_parked_and_unparked_by_scaling(monkeypatch):
    monkeypatch.setenv("LLMGW_PARK_AFTER", "3")
    fleet("h100-hgx:1")
    model("crashy", H100)
    for attempt in range(3):
        reconcile()
        (r,) = live("crashy")
        heartbeat("hgx-000", [shard_entry(r, "starting")])
        heartbeat(
            "hgx-000",
            [shard_entry(r, "failed", error="engine exited with status 1", log_tail=["CUDA out of memory"])],
        )
        assert CatalogModel.objects.get(name="crashy").failure_streak == attempt + 1
        reconcile()  # stops the failed one
        # The agent stops it too; its row goes once the agent no longer lists it.
        heartbeat("hgx-000", [])

    reconcile()
    m = CatalogModel.objects.get(name="crashy")
    assert m.parked_at is not None and "CUDA out of memory" in m.parked_error
    assert live("crashy") == []
    explanation = PlacementExplanation.objects.get(model=m)
    assert not explanation.placed and "parked" in explanation.rejections[0]["reason"]
    reconcile()
    assert live("crashy") == [], "a parked model stays parked"

    service.scale_model("crashy", min_replicas=1, max_replicas=1, actor="operator")
    reconcile()
    assert len(live("crashy")) == 1
    assert CatalogModel.objects.get(name="crashy").parked_at is None


def test_a_replica_that_fails_after_serving_does_not_count_as_a_failed_start(monkeypatch):
    monkeypatch.setenv("LLMGW_PARK_AFTER", "1")
    fleet("h100-hgx:1")
    model("m", H100)
    reconcile()
    (r,) = live("m")
    report_ready(r)
    heartbeat("hgx-000", [shard_entry(r, "failed", error="killed")])
    assert Replica.objects.get(id=r.id).state == ReplicaState.FAILED
    reconcile()
    assert CatalogModel.objects.get(name="m").parked_at is None


def test_an_idle_replica_is_scaled_down_to_the_minimum():
    fleet("h100-hgx:1")
    model("on-demand", H100, min_replicas=0, max_replicas=1, idle_timeout="10m")
    reconcile()
    assert live("on-demand") == []

    demand.request_replica("on-demand")
    start = timezone.now()
    reconcile(start)
    (r,) = live("on-demand")
    assert not Demand.objects.exists(), "the demand was met"
    report_ready(r)

    demand.touch(r.id, start + timedelta(minutes=8))
    reconcile(start + timedelta(minutes=12))
    assert Replica.objects.get(id=r.id).state == ReplicaState.READY, "used 4 minutes ago"
    reconcile(start + timedelta(minutes=19))
    assert Replica.objects.get(id=r.id).state == ReplicaState.STOPPING
    reconcile(start + timedelta(minutes=20))
    assert live("on-demand") == [], "not started again without demand"


def test_never_used_counts_idleness_from_creation():
    fleet("h100-hgx:1")
    model("m", H100, min_replicas=0, max_replicas=1, idle_timeout="5m")
    demand.request_replica("m")
    start = timezone.now()
    reconcile(start)
    (r,) = live("m")
    report_ready(r)
    reconcile(start + timedelta(minutes=6))
    assert Replica.objects.get(id=r.id).state == ReplicaState.STOPPING


def test_a_start_longer_than_the_idle_timeout_is_not_idleness():
    """Never used: idle since it became ready, not since it was placed (a 10-minute start, a 5-minute timeout)."""
    fleet("h100-hgx:1")
    model("m", H100, min_replicas=0, max_replicas=1, idle_timeout="5m")
    demand.request_replica("m")
    reconcile()
    (r,) = live("m")
    Replica.objects.filter(pk=r.pk).update(created_at=timezone.now() - timedelta(minutes=10))
    report_ready(r)
    ready = Replica.objects.get(id=r.id)
    assert ready.ready_at is not None and ready.last_used_at is None
    reconcile(ready.ready_at + timedelta(minutes=1))
    assert Replica.objects.get(id=r.id).state == ReplicaState.READY, "ready a minute ago: not idle yet"
    reconcile(ready.ready_at + timedelta(minutes=6))
    assert Replica.objects.get(id=r.id).state == ReplicaState.STOPPING


def test_a_stale_profile_is_reported_not_restarted():
    fleet("h100-hgx:1")
    model("m", H100)
    reconcile()
    (r,) = live("m")
    report_ready(r)
    service.upsert_model(
        {
            "name": "m",
            "scaling": {"min": 1, "max": 1},
            "profiles": [{**H100, "engine_args": ["--max-model-len", "8192"]}],
        },
        actor="test",
        declared_in="store",
    )
    reconcile()
    assert Replica.objects.get(id=r.id).state == ReplicaState.READY
    assert Replica.objects.get(id=r.id).stale
    (line,) = PlacementExplanation.objects.get(model__name="m").stale
    assert line["replica"] == r.id and line["placed_fingerprint"] != line["current_fingerprint"]


def test_a_lost_node_loses_its_replicas_an_unreachable_one_keeps_them():
    fleet("h100-hgx:2")
    model("m", H100)
    Node.objects.filter(name="hgx-001").update(state="cordoned")
    reconcile()
    (r,) = live("m")
    Node.objects.filter(name="hgx-001").update(state="ready")

    Node.objects.filter(name="hgx-000").update(reachable=False, unreachable_since=timezone.now())
    reconcile()
    assert live("m") == [r], "merely unreachable: kept"

    Node.objects.filter(name="hgx-000").update(lost=True)
    reconcile()
    assert not Replica.objects.filter(id=r.id).exists()
    (again,) = live("m")
    assert nodes_of(again) == ["hgx-001"]


def test_running_twice_changes_nothing_the_second_time():
    fleet("h100-hgx:2,cpu:1")
    model("a", H100, max_replicas=2)
    model("b", gpu_profile("h100-80g", gpus=8, nodes=3))
    reconcile()

    def state():
        return (
            sorted(Replica.objects.values_list("id", "state", "stopping_since")),
            sorted(Shard.objects.values_list("id", "state", "gpu_indices")),
            sorted(PlacementExplanation.objects.values_list("model__name", "computed_at", "placed")),
        )

    before = state()
    second = reconcile()
    assert not second.changed, second
    assert state() == before


@pytest.mark.django_db(transaction=True)
def test_the_task_holds_its_lock_and_skips_when_another_holds_it():
    fleet("h100-hgx:1")
    model("m", H100)
    holding, release = threading.Event(), threading.Event()

    def other_worker():
        with exclusive(tasks.LOCK) as held:
            assert held
            holding.set()
            release.wait(10)
        connection.close()

    worker = threading.Thread(target=other_worker)
    worker.start()
    try:
        assert holding.wait(10)
        assert tasks.reconcile() == {"skipped": "another worker holds the lock"}
        assert live("m") == []
    finally:
        release.set()
        worker.join()
    done = tasks.reconcile()
    assert done["created"] == 1
    assert tasks.reconcile()["created"] == 0


def test_a_multi_node_replica_is_ready_when_every_rank_is_with_rank_zeros_endpoint():
    fleet("h100-hgx:2@north")
    model("wide", gpu_profile("h100-80g", gpus=8, nodes=2))
    reconcile()
    (r,) = live("wide")
    first, second = Shard.objects.filter(replica=r).select_related("node").order_by("rank")
    heartbeat(first.node.name, [shard_entry(r, "ready", 0, endpoint="http://127.0.0.1:8000")])
    assert Replica.objects.get(id=r.id).state == ReplicaState.STARTING
    heartbeat(second.node.name, [shard_entry(r, "fetching", 1, fetch={"source": "hf://x/y", "bytes_done": 5})])
    shard = Shard.objects.get(pk=second.pk)
    assert (shard.fetch_done, shard.fetch_total, shard.fetch_percent) == (5, None, None), "bytes only"
    heartbeat(second.node.name, [shard_entry(r, "ready", 1)])
    r.refresh_from_db()
    assert r.state == ReplicaState.READY and r.endpoint == "http://127.0.0.1:8000"


@pytest.mark.django_db(transaction=True)
def test_changes_queue_one_reconcile_after_commit_and_one_more_for_those_that_came_meanwhile(monkeypatch):
    from django.db import transaction

    from placement import signals

    queued = []
    # This coalescer's sends only: a trailing timer another test left on the process's coalescer may
    # fire meanwhile, and must not be counted here.
    coalescer = signals._Coalescer(0.3, send=lambda why: queued.append(time.monotonic()))
    monkeypatch.setattr(signals, "_coalescer", coalescer)
    with transaction.atomic():
        signals.node_state_changed("hgx-000")
        assert queued == [], "not before the change is committed"
    assert len(queued) == 1
    # The window runs from when the coalescer decided, not from when the task was queued: a thread
    # descheduled between the two (a loaded machine) must not make the next one look early.
    decided = coalescer.last
    # A burst (a flush that found 300 nodes back): one more reconcile, when the window ends.
    for i in range(300):
        signals.node_state_changed(f"hgx-{i:03}")
    assert len(queued) == 1
    deadline = time.monotonic() + 3
    while len(queued) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.5)
    assert len(queued) == 2 and queued[1] >= decided + 0.3
    # Quiet again: the next change is queued at once.
    signals.catalog_changed("m")
    assert len(queued) == 3
