"""Replicas (shards, downloads in flight, stale, idle) and placement explanations."""

from __future__ import annotations

import pytest
from django.utils import timezone

from catalog.models import Profile
from inventory.models import Node
from placement.models import PlacementExplanation, Shard
from tests.api.fleet import add_model, ingest_fleet, place, used_long_ago

pytestmark = pytest.mark.django_db


@pytest.fixture
def model(db):
    ingest_fleet("h100-hgx:2@north")
    return add_model()


def test_a_replica_shows_its_shards_and_a_download_with_its_progress(operator, model):
    replica = place(model, "hgx-000", [0, 1], state="starting", shard_state="fetching")
    Shard.objects.filter(replica=replica).update(fetch_source="hf://x/y", fetch_done=250, fetch_total=1000)
    [view] = operator.get("/api/v1/replicas").json()
    assert view["id"] == replica.id and view["state"] == "starting" and view["gpus"] == 2
    assert view["idle_seconds"] == -1, "never used is not idle"
    [shard] = view["shards"]
    assert shard["id"] == f"{replica.id}-0" and shard["node"] == "hgx-000" and shard["gpus"] == [0, 1]
    assert shard["fetch"] == {"source": "hf://x/y", "bytes_done": 250, "bytes_total": 1000, "percent": 25}


def test_a_download_of_unknown_size_has_bytes_but_no_invented_percent(operator, model):
    replica = place(model, "hgx-000", [0], state="starting", shard_state="fetching")
    Shard.objects.filter(replica=replica).update(fetch_source="https://x/y.gguf", fetch_done=42)
    fetch = operator.get("/api/v1/replicas").json()[0]["shards"][0]["fetch"]
    assert fetch == {"source": "https://x/y.gguf", "bytes_done": 42}


def test_the_agents_fresher_word_on_a_download_wins(operator, model):
    replica = place(model, "hgx-000", [0], state="starting", shard_state="fetching")
    Node.objects.filter(name="hgx-000").update(
        shard_status=[{"id": f"{replica.id}-0", "fetch": {"source": "hf://a/b", "bytes_done": 5, "bytes_total": 10}}]
    )
    fetch = operator.get("/api/v1/replicas").json()[0]["shards"][0]["fetch"]
    assert fetch["percent"] == 50 and fetch["source"] == "hf://a/b"


def test_a_ready_replica_has_no_download(operator, model):
    replica = place(model, "hgx-000", [0])
    Shard.objects.filter(replica=replica).update(fetch_done=10, fetch_total=10)
    assert "fetch" not in operator.get("/api/v1/replicas").json()[0]["shards"][0]


def test_stale_and_idle(operator, model):
    replica = place(model, "hgx-000", [0])
    used_long_ago(replica, 15)
    Profile.objects.filter(model=model).update(fingerprint="changed")
    [view] = operator.get("/api/v1/replicas").json()
    assert view["stale"] and 899 <= view["idle_seconds"] <= 905


def test_replicas_of_one_model_by_name_or_alias(operator, model):
    place(model, "hgx-000", [0])
    other = add_model({**_cpu_model()})
    place(other, "hgx-001", [0])
    assert [r["model"] for r in operator.get("/api/v1/replicas?model=llama").json()] == ["llama-8b"]
    assert len(operator.get("/api/v1/replicas").json()) == 2
    unknown = operator.get("/api/v1/replicas?model=nope")
    assert unknown.status_code == 404 and "ctl models" in unknown.json()["error"]


def _cpu_model():
    return {
        "name": "tiny",
        "profiles": [{"name": "cpu", "engine": "llamacpp", "gpu_class": "cpu", "memory_gb": 1, "gpus": 0}],
    }


def test_explain_before_the_reconciler_has_looked(operator, model):
    view = operator.get("/api/v1/explain-placement?model=llama-8b").json()
    assert view == {
        "model": "llama-8b",
        "placed": False,
        "rejections": [],
        "note": "The reconciler has not looked at this model yet; ask again in a few seconds.",
    }


def test_explain_gives_each_rejection(operator, model):
    PlacementExplanation.objects.create(
        model=model,
        computed_at=timezone.now(),
        placed=False,
        rejections=[
            {"profile": "h100", "pool": None, "node": None, "reason": "412 nodes: no h100-80g free", "nodes": 412},
            {"profile": "h100", "pool": "a", "node": "hgx-001", "reason": "cordoned: takes nothing new", "nodes": 1},
        ],
    )
    view = operator.get("/api/v1/explain-placement?model=llama").json()
    assert not view["placed"] and view["satisfied"] is False and "computed_at" in view
    assert view["rejections"] == [
        {"profile": "h100", "reason": "412 nodes: no h100-80g free", "nodes": 412},
        {"profile": "h100", "pool": "a", "node": "hgx-001", "reason": "cordoned: takes nothing new", "nodes": 1},
    ]


def test_explain_refusals(operator, model):
    missing = operator.get("/api/v1/explain-placement")
    assert missing.status_code == 400 and "?model=NAME" in missing.json()["error"]
    assert operator.get("/api/v1/explain-placement?model=nope").status_code == 404


def test_the_replica_list_reads_a_fixed_number_of_queries_however_many_replicas(
    operator, model, django_assert_max_num_queries
):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    place(model, "hgx-000", [0])
    with CaptureQueriesContext(connection) as one:
        operator.get("/api/v1/replicas")
    ingest_fleet("h100-hgx:4@south", prefix="more-")
    for node in Node.objects.filter(name__startswith="more-"):
        place(model, node.name, [0, 1])
        place(model, node.name, [2])
    with django_assert_max_num_queries(len(one.captured_queries)):
        views = operator.get("/api/v1/replicas").json()
    assert len(views) == 9 and {v["model"] for v in views} == {model.name}


def test_the_replica_list_leaves_the_cycle_collector_as_it_found_it(operator, model):
    import gc

    place(model, "hgx-000", [0])
    assert gc.isenabled()
    assert operator.get("/api/v1/replicas").status_code == 200
    assert gc.isenabled()
