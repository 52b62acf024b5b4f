"""A replica whose node never reports it ready is failed past its start deadline and placed again, on PostgreSQL.

The agents are played by heartbeats through the real endpoint: a wedged (or
hostile) one that says "fetching" with every beat and never more. The
deadline follows the model's size and the node's measured download rate
(placement.scheduling.startdeadline); ``explain`` says what happened.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from catalog.models import CatalogModel
from core.models import AuditEntry
from placement import reads
from placement.models import ColdStart, Demand, Replica, ReplicaState
from placement.writes import demand
from placement.writes.reconciler import reconcile
from tests.placement.dbfleet import fleet, gpu_profile, heartbeat, live, model, nodes_of, report_ready, shard_entry

pytestmark = pytest.mark.django_db

H100 = gpu_profile("h100-80g", gpus=8, name="h100")
GB = 10**9


def measured_download(model_name: str, node: str, gigabytes: int, seconds: float, load_s: float = 60.0) -> None:
    """An earlier start of ``model_name`` on ``node`` that downloaded ``gigabytes`` in ``seconds``."""
    m = CatalogModel.objects.get(name=model_name)
    n = ColdStart.objects.count()
    ColdStart.objects.create(
        model=m,
        profile_name="h100",
        node=node,
        replica_id=f"old{n}",
        fetch_s=seconds,
        load_s=load_s,
        weights_local=False,
        fetch_bytes=gigabytes * GB,
    )


def test_a_replica_never_reported_ready_is_failed_past_its_deadline_and_placed_again(monkeypatch):
    monkeypatch.setenv("LLMGW_START_DEADLINE_FLOOR_S", "600")
    fleet("h100-hgx:2")
    model("m", H100)
    # 100 GB at 100 MB/s measured on either node, loads of 60 s: 3 × (1000 + 60) = 3180 s.
    for node in ("hgx-000", "hgx-001"):
        measured_download("m", node, 100, 1000.0)
    start = timezone.now()
    reconcile(start)
    (stuck,) = live("m")
    (node,) = nodes_of(stuck)
    heartbeat(node, [shard_entry(stuck, "fetching", fetch={"source": "hf://m", "bytes_done": 10**6})])
    assert Replica.objects.get(pk=stuck.pk).state == ReplicaState.STARTING

    reconcile(start + timedelta(seconds=3170))
    assert [r.id for r in live("m")] == [stuck.id], "not past 3180 s yet"

    result = reconcile(start + timedelta(seconds=3190))
    assert result.timed_out == [stuck.id]
    failed = Replica.objects.get(pk=stuck.pk)
    assert failed.state == ReplicaState.STOPPING, "failed, then stopped by the same pass: its GPUs are freed"
    assert failed.error.startswith(f"replica {stuck.id} on {node} was not ready 3190 s after it was placed")
    assert "start deadline of 3180 s (3 × (fetch 1000 s: 100.0 GB at 100.0 MB/s measured on " in failed.error
    (again,) = live("m")
    assert again.id != stuck.id and nodes_of(again) != [node], "placed again, on the node with free GPUs"
    assert CatalogModel.objects.get(name="m").failure_streak == 1, "a failed start, as a crash is"

    view = reads.explain(CatalogModel.objects.get(name="m"))
    assert view["placed"] is True
    (told,) = view["start_timeouts"]
    assert told["replica"] == stuck.id and told["nodes"] == [node] and told["deadline_s"] == 3180
    assert told["reason"] == failed.error and told["reason"].endswith("so that another is placed")
    assert AuditEntry.objects.filter(action="start-timeout", target=f"m#{stuck.id}").exists()

    # The wedged agent wakes up and says ready: the stopped replica stays stopped and serves nothing.
    heartbeat(node, [shard_entry(stuck, "ready", endpoint="http://127.0.0.1:8000")])
    assert Replica.objects.get(pk=stuck.pk).state == ReplicaState.STOPPING
    reconcile(start + timedelta(seconds=3200))
    assert [r.id for r in live("m")] == [again.id], "nothing failed twice, nothing placed twice"


def test_the_deadline_follows_the_models_size_and_the_nodes_measured_rate(monkeypatch):
    monkeypatch.setenv("LLMGW_START_DEADLINE_FLOOR_S", "60")
    fleet("h100-hgx:1")
    model("big", H100)
    model("small", H100, min_replicas=0, max_replicas=1)
    # The node downloads at 1 GB/s (measured on another model); big's weights are 2,000 GB (a prefetch said).
    measured_download("small", "hgx-000", 10, 10.0)
    big = CatalogModel.objects.get(name="big")
    big.prefetches.create(node="elsewhere", source="hf://big", requested_by="op", bytes_total=2000 * GB)
    start = timezone.now()
    reconcile(start)
    (r,) = live("big")
    heartbeat("hgx-000", [shard_entry(r, "fetching")])
    # 3 × (2000 s + the default 60 s of load) = 6180 s.
    reconcile(start + timedelta(seconds=6170))
    assert [x.id for x in live("big")] == [r.id]
    reconcile(start + timedelta(seconds=6190))
    assert Replica.objects.get(pk=r.pk).state == ReplicaState.STOPPING
    assert "2000.0 GB at 1000.0 MB/s measured on hgx-000; load 60 s: the default) = 6180 s" in (
        Replica.objects.get(pk=r.pk).error
    )


def test_a_replica_ready_before_its_deadline_is_left_alone(monkeypatch):
    monkeypatch.setenv("LLMGW_START_DEADLINE_FLOOR_S", "600")
    fleet("h100-hgx:1")
    model("m", H100)
    start = timezone.now()
    reconcile(start)
    (r,) = live("m")
    heartbeat("hgx-000", [shard_entry(r, "starting")])
    report_ready(r)
    reconcile(start + timedelta(days=2))
    assert Replica.objects.get(pk=r.pk).state == ReplicaState.READY
    assert CatalogModel.objects.get(name="m").failure_streak == 0


def test_an_agent_that_never_picks_the_shard_up_is_caught_by_the_floor(monkeypatch):
    """Pending for ever (the node heartbeats, but never lists the shard): the floor applies, nothing measured."""
    monkeypatch.setenv("LLMGW_START_DEADLINE_FLOOR_S", "1800")
    fleet("h100-hgx:2")
    model("m", H100)
    start = timezone.now()
    reconcile(start)
    (r,) = live("m")
    heartbeat(nodes_of(r)[0], [])
    reconcile(start + timedelta(seconds=1799))
    assert Replica.objects.get(pk=r.pk).state == ReplicaState.PENDING
    reconcile(start + timedelta(seconds=1801))
    assert Replica.objects.get(pk=r.pk).state == ReplicaState.STOPPING
    assert "raised to the floor of 1800 s" in Replica.objects.get(pk=r.pk).error
    assert len(live("m")) == 1


def test_the_idle_timeout_counts_from_the_replacement_being_ready_not_from_the_stuck_start(monkeypatch):
    monkeypatch.setenv("LLMGW_START_DEADLINE_FLOOR_S", "600")
    fleet("h100-hgx:2")
    model("od", H100, min_replicas=0, max_replicas=1, idle_timeout="5m")
    demand.request_replica("od")
    start = timezone.now()
    reconcile(start)
    (stuck,) = live("od")
    heartbeat(nodes_of(stuck)[0], [shard_entry(stuck, "fetching")])
    # Older than the idle timeout, never ready: not idle, so not stopped for it (only its deadline fails it).
    reconcile(start + timedelta(minutes=9))
    assert Replica.objects.get(pk=stuck.pk).state == ReplicaState.STARTING

    # Requests still wait, so the gateway asks again; past the deadline the stuck one fails and another is placed.
    late = start + timedelta(minutes=31)
    demand.request_replica("od")
    Demand.objects.update(requested_at=late)  # asked at that time, as the gateway would
    assert reconcile(late).timed_out == [stuck.id]
    (again,) = live("od")
    report_ready(again)
    ready_at = Replica.objects.get(pk=again.pk).ready_at
    reconcile(ready_at + timedelta(minutes=1))
    assert Replica.objects.get(pk=again.pk).state == ReplicaState.READY, "ready a minute ago: not idle"
    reconcile(ready_at + timedelta(minutes=6))
    assert Replica.objects.get(pk=again.pk).state == ReplicaState.STOPPING, "idle past its timeout"
    assert live("od") == [], "not started again without demand"


def test_a_ready_report_records_the_bytes_its_fetch_brought():
    """What a node's rate is measured from: the ColdStart row keeps the download's bytes."""
    fleet("h100-hgx:1")
    model("m", H100)
    reconcile()
    (r,) = live("m")
    fetched = {"source": "hf://m", "bytes_done": 40 * GB, "bytes_total": 40 * GB}
    heartbeat("hgx-000", [shard_entry(r, "fetching", fetch={"source": "hf://m", "bytes_done": GB})])
    phases = {"fetch_s": 400.0, "load_s": 30.0, "weights_local": False}
    heartbeat("hgx-000", [shard_entry(r, "ready", endpoint="http://127.0.0.1:8000", phases=phases, fetch=fetched)])
    (row,) = ColdStart.objects.all()
    assert (row.fetch_bytes, row.fetch_s) == (40 * GB, 400.0)
