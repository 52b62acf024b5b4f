"""Autoscaling through the reconciler, on PostgreSQL: a load scales a model up, and back down to its minimum.

The load is what gateway workers publish (``placement.writes.load``): to
the real Redis at LLMGW_TEST_REDIS_URL, or to the database when Redis is
not configured or does not answer (a URL nothing listens on). Each decision
is recorded with its reason in numbers: the model's ``Autoscale`` row, a
``ScaleEvent`` per change, an audit entry, and the stop of each replica.
"""

from __future__ import annotations

import itertools
import os
from datetime import timedelta

import pytest
import redis
from django.utils import timezone

from catalog.models import CapacityMeasurement
from core.config import ConfigError
from core.models import AuditEntry
from placement.models import Autoscale, LoadReport, ScaleEvent
from placement.scheduling.autoscale import Policy
from placement.writes import autoscaling, demand, load
from placement.writes.reconciler import reconcile
from tests.placement.dbfleet import fleet, gpu_profile, live, model, report_ready

pytestmark = pytest.mark.django_db

H100 = gpu_profile("h100-80g", gpus=8, name="h100")
REDIS_URL = os.environ.get("LLMGW_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
NOBODY = "redis://127.0.0.1:1/0"


@pytest.fixture
def redis_client():
    client = redis.Redis.from_url(REDIS_URL)
    for key in client.scan_iter(match=load.KEY_PREFIX + "*"):
        client.delete(key)
    yield client
    for key in client.scan_iter(match=load.KEY_PREFIX + "*"):
        client.delete(key)
    client.close()


@pytest.fixture
def cooldown(monkeypatch):
    monkeypatch.setenv("LLMGW_AUTOSCALE_COOLDOWN_S", "60")
    monkeypatch.setenv("LLMGW_AUTOSCALE_UP_WINDOW_S", "15")


def _measured(concurrency: int = 16) -> None:
    CapacityMeasurement.objects.create(
        model_name="m", profile_name="h100", measurement={"max_concurrency": concurrency, "tokens_per_second": 5000}
    )


def _publish_redis(client, owner: str, in_flight: int, now, waiting: int = 0) -> None:
    fields = load.encode({"m": {"in_flight": in_flight, "waiting": waiting, "tokens_per_s": 0}}, now.timestamp())
    client.delete(load.redis_key(owner))
    client.hset(load.redis_key(owner), mapping=fields)
    client.expire(load.redis_key(owner), int(load.LOAD_TTL_S))


def _publish_db(owner: str, in_flight: int, now, waiting: int = 0) -> None:
    load.store(owner, {"m": {"in_flight": in_flight, "waiting": waiting, "tokens_per_s": 0}} if in_flight else {}, now)


def _ready_all() -> None:
    for r in live("m"):
        if r.state != "ready":
            report_ready(r)


def _walk(publish, now, in_flight: int, seconds: int, step: int = 5):
    """Reconcile every ``step`` seconds for ``seconds`` with the load at ``in_flight``; the replicas start at once."""
    for _ in range(seconds // step):
        publish(in_flight, now)
        reconcile(now=now)
        _ready_all()
        now += timedelta(seconds=step)
    return now


def _scale_up_and_down(publish) -> None:
    fleet("h100-hgx:4")
    model("m", H100, min_replicas=1, max_replicas=4)
    _measured(16)
    now = timezone.now()
    reconcile(now=now)
    _ready_all()
    assert len(live("m")) == 1

    # 41 in flight on one replica at 16 each and 80 %: 4 wanted, after the 15 s window.
    publish(41, now)
    reconcile(now=now)
    row = Autoscale.objects.get(model__name="m")
    assert (row.desired, row.direction, len(live("m"))) == (1, "hold", 1)
    assert "in flight 41 on 1 replica, capacity 16 each and 5000 tokens/s at 80 % → 4; up from 1 in 15 s" in row.reason
    now = _walk(publish, now + timedelta(seconds=15), 41, 5)
    assert len(live("m")) == 4
    (up,) = ScaleEvent.objects.filter(model__name="m")
    assert (up.from_replicas, up.to_replicas, up.direction) == (1, 4, "up")
    assert up.reason.startswith("in flight 41 on 1 replica, capacity 16 each and 5000 tokens/s at 80 % → 4")
    audit = AuditEntry.objects.filter(action="scale-up", target="m").get()
    assert audit.detail["to"] == 4 and audit.detail["reason"] == up.reason

    # The load falls to nothing: one replica fewer per cooldown (60 s), down to the minimum of 1, never below.
    now = _walk(publish, now, 0, 400)
    assert len(live("m")) == 1
    downs = list(ScaleEvent.objects.filter(model__name="m", direction="down").order_by("at"))
    assert [(e.from_replicas, e.to_replicas) for e in downs] == [(4, 3), (3, 2), (2, 1)]
    gaps = [(b.at - a.at).total_seconds() for a, b in itertools.pairwise(downs)]
    assert all(g >= 60 for g in gaps), gaps
    assert "in flight 0 on 4 replicas, capacity 16 each and 5000 tokens/s: fits on 3 at 60 %" in downs[0].reason
    stops = AuditEntry.objects.filter(action="stop-replica", target__startswith="m#").order_by("id")
    assert [s.detail["reason"].split(":")[0] for s in stops] == [
        "scaling down to 3",
        "scaling down to 2",
        "scaling down to 1",
    ]
    assert Autoscale.objects.get(model__name="m").desired == 1


def test_a_load_in_redis_scales_up_and_back_down_to_min(settings, cooldown, redis_client):
    settings.LLMGW_REDIS_URL = REDIS_URL
    _scale_up_and_down(lambda n, now: _publish_redis(redis_client, "gw-a", n, now))
    assert Autoscale.objects.get(model__name="m").load_source == "redis"


def test_redis_down_the_load_comes_from_the_database(settings, cooldown):
    settings.LLMGW_REDIS_URL = NOBODY
    _scale_up_and_down(lambda n, now: _publish_db("gw-a", n, now))
    up = AuditEntry.objects.get(action="scale-up", target="m")
    assert up.detail["load_source"] == "database"
    assert "Redis did not answer" in up.detail["problem"]


def test_workers_on_both_stores_are_summed_and_each_counted_once(settings, redis_client):
    settings.LLMGW_REDIS_URL = REDIS_URL
    now = timezone.now()
    _publish_redis(redis_client, "gw-a", 10, now)
    _publish_db("gw-b", 7, now, waiting=2)
    # gw-c moved back to Redis: its newer Redis report counts, not its older row.
    _publish_db("gw-c", 100, now - timedelta(seconds=2))
    _publish_redis(redis_client, "gw-c", 3, now)
    seen = load.fleet(now, REDIS_URL)
    assert (seen.of("m").in_flight, seen.of("m").waiting, seen.of("m").workers) == (20, 2, 3)
    assert seen.source == "redis+database"
    # Rows older than the time to live are workers that stopped: they count for nothing.
    later = load.fleet(now + timedelta(seconds=load.LOAD_TTL_S + 1), NOBODY)
    assert later.of("m").in_flight == 0 and later.source == "none" and "Redis did not answer" in later.problem


def test_no_redis_configured_reads_the_database(settings):
    settings.LLMGW_REDIS_URL = None
    now = timezone.now()
    _publish_db("gw-a", 5, now)
    seen = load.fleet(now, None)
    assert (seen.of("m").in_flight, seen.source, seen.problem) == (5, "database", "")
    load.forget("gw-a")
    assert not LoadReport.objects.exists()


def test_an_unmeasured_profile_scales_on_the_default_and_says_so(settings, cooldown):
    settings.LLMGW_REDIS_URL = None
    fleet("h100-hgx:2")
    model("m", H100, min_replicas=1, max_replicas=2)
    now = timezone.now()
    reconcile(now=now)
    _publish_db("gw-a", 9, now)
    reconcile(now=now)
    _publish_db("gw-a", 9, now + timedelta(seconds=15))
    reconcile(now=now + timedelta(seconds=15))
    row = Autoscale.objects.get(model__name="m")
    assert row.desired == 2 and not row.capacity_measured
    assert "capacity 8 each (a default: none measured for profile h100) at 80 % → 2" in row.reason
    assert len(live("m")) == 2


def test_autoscaling_off_keeps_the_minimum(settings, monkeypatch):
    settings.LLMGW_REDIS_URL = None
    monkeypatch.setenv("LLMGW_AUTOSCALE", "off")
    fleet("h100-hgx:2")
    model("m", H100, min_replicas=1, max_replicas=2)
    now = timezone.now()
    _publish_db("gw-a", 50, now)
    reconcile(now=now)
    reconcile(now=now + timedelta(seconds=60))
    assert len(live("m")) == 1 and not Autoscale.objects.exists()


def test_a_model_at_zero_still_starts_on_demand_and_is_not_started_by_nothing(settings):
    settings.LLMGW_REDIS_URL = None
    fleet("h100-hgx:2")
    model("m", H100, min_replicas=0, max_replicas=2)
    now = timezone.now()
    reconcile(now=now)
    reconcile(now=now + timedelta(seconds=60))
    assert live("m") == []
    demand.request_replica("m")
    reconcile(now=timezone.now())
    assert len(live("m")) == 1


def test_replicas_stopped_for_idleness_are_not_started_again(settings):
    """The idle timeout stops what nobody uses; the autoscaler settles on what is left instead of refilling it."""
    settings.LLMGW_REDIS_URL = None
    fleet("h100-hgx:3")
    model("m", H100, min_replicas=1, max_replicas=3, idle_timeout="60s")
    _measured(16)
    now = timezone.now()
    reconcile(now=now)
    _publish_db("gw-a", 41, now)
    reconcile(now=now)
    now += timedelta(seconds=15)
    _publish_db("gw-a", 41, now)
    reconcile(now=now)
    _ready_all()
    assert len(live("m")) == 3
    assert "(needs 4; capped at the maximum of 3)" in ScaleEvent.objects.get(direction="up").reason
    # Nobody uses them for the idle timeout: the idle stop takes the model to its minimum in one round.
    now = _walk(lambda n, at: _publish_db("gw-a", n, at), now + timedelta(seconds=100), 0, 60)
    assert len(live("m")) == 1
    settle = ScaleEvent.objects.get(direction="settle")
    assert (settle.from_replicas, settle.to_replicas) == (3, 1)
    assert "(3 were wanted; 1 remain and the load fits on them)" in settle.reason
    assert AuditEntry.objects.filter(action="scale-settle", target="m").exists()


def test_the_knobs_come_from_the_environment_and_a_bad_one_is_named():
    assert autoscaling.policy({}) == Policy()
    knobs = autoscaling.policy({"LLMGW_AUTOSCALE_TARGET": "0.7", "LLMGW_AUTOSCALE_COOLDOWN_S": "120"})
    assert (knobs.target_share, knobs.down_share, knobs.cooldown_s) == (0.7, pytest.approx(0.525), 120.0)
    for env, name in (
        ({"LLMGW_AUTOSCALE_TARGET": "lots"}, "LLMGW_AUTOSCALE_TARGET"),
        ({"LLMGW_AUTOSCALE_TARGET": "0.5", "LLMGW_AUTOSCALE_DOWN": "0.5"}, "LLMGW_AUTOSCALE_DOWN"),
        ({"LLMGW_AUTOSCALE_UP_WINDOW_S": "-1"}, "LLMGW_AUTOSCALE_UP_WINDOW_S"),
    ):
        with pytest.raises(ConfigError) as refused:
            autoscaling.policy(env)
        assert name in str(refused.value)
    assert not autoscaling.enabled({"LLMGW_AUTOSCALE": "off"}) and autoscaling.enabled({})
