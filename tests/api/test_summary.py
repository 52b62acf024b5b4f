"""The summary: the whole fleet in one answer, in a fixed number of queries whatever its size."""

from __future__ import annotations

import httpx
import pytest
from django.utils import timezone

from agent.simulator import fleet as F
from catalog.models import CatalogModel
from inventory.models import Node
from placement.models import PlacementExplanation
from tests.api.fleet import add_model, ingest, ingest_fleet, place, used_long_ago

pytestmark = pytest.mark.django_db


@pytest.fixture
def fleet(db):
    sims = {s.name: s for s in ingest_fleet("h100-hgx:3@north,a100-mig:1,cpu:1")}
    model = add_model()
    used_long_ago(place(model, "hgx-000", [0, 1]), 30)
    place(model, "hgx-001", [0], state="starting", shard_state="fetching")
    return sims


def test_the_summary_adds_up(operator, fleet):
    F.gpu_lost(fleet["hgx-002"], 7)
    ingest(fleet["hgx-002"])
    Node.objects.filter(name="hgx-002").update(state="cordoned")
    Node.objects.filter(name="cpu-00").update(reachable=False)
    Node.objects.filter(name="hgx-001").update(weights=[{"path": "/m/a", "name": "a"}, {"path": "/m/b", "name": "b"}])
    s = operator.get("/api/v1/summary").json()
    assert s["nodes"] == {"total": 5, "ready": 3, "cordoned": 1, "draining": 0, "unreachable": 1}
    h100 = next(c for c in s["gpus"] if c["class"] == "h100-80g")
    # 24 cards: 3 held by shards, 1 unhealthy; the cordoned node's 7 healthy cards are not free capacity.
    assert (h100["total"], h100["used"], h100["unhealthy"], h100["free"]) == (24, 3, 1, 13)
    mig = next(c for c in s["gpus"] if c["class"].startswith("a100-80g-mig-"))
    assert mig["total"] == 4 and mig["held"] == 0 and mig["free"] == 4, "the simulated instances carry MIG UUIDs"
    assert s["fabrics"] == [
        {"fabric": "north", "nodes": 3, "nodes_with_weights": 1, "models_present": 2, "largest_free_block": 0}
    ]
    assert s["replicas"] | {} == {
        "total": 2,
        "ready": 1,
        "starting": 1,
        "stopping": 0,
        "failed": 0,
        "fetching": 0,
        "stale": 0,
    }
    [idle] = s["idle_replicas"]
    assert idle["model"] == "llama-8b" and idle["gpus"] == 2 and idle["idle_seconds"] >= 1800
    assert s["models"] == {"total": 1, "satisfied": 1, "short": 0} and s["unplaceable"] == [] and s["parked"] == []
    assert "store" not in s, "no Patroni configured: absent"


def test_short_unplaceable_and_parked_models_are_named(operator, fleet):
    cpu = add_model(
        {
            "name": "tiny",
            "scaling": {"min": 1},
            "profiles": [{"name": "cpu", "engine": "llamacpp", "gpu_class": "cpu", "memory_gb": 1, "gpus": 0}],
        }
    )
    on_demand = add_model({"name": "burst", "scaling": {"min": 0, "max": 1}, "profiles": cpu_profile()})
    PlacementExplanation.objects.create(model=on_demand, placed=False, rejections=[{"profile": "cpu", "reason": "x"}])
    CatalogModel.objects.filter(pk=cpu.pk).update(parked_at=timezone.now(), parked_error="OOM", failure_streak=5)
    s = operator.get("/api/v1/summary").json()
    assert s["models"] == {"total": 3, "satisfied": 1, "short": 2}
    assert s["unplaceable"] == ["burst"], "an on-demand model asked for and fitting nowhere is short"
    assert s["parked"] == [{"model": "tiny", "failures": 5, "reason": "OOM"}]


def cpu_profile():
    return [{"name": "cpu", "engine": "llamacpp", "gpu_class": "cpu", "memory_gb": 1, "gpus": 0}]


def test_patroni_members_are_shown_and_its_failure_said(operator, fleet, monkeypatch):
    cluster = {
        "members": [
            {"name": "pg1", "host": "10.0.0.1", "role": "leader", "state": "running"},
            {"name": "pg2", "host": "10.0.0.2", "role": "replica", "state": "streaming", "lag": 4096},
            {"name": "pg3", "host": "10.0.0.3", "role": "replica", "state": "stopped", "lag": "unknown"},
        ]
    }
    asked = []

    def fake_get(url, timeout):
        asked.append(url)
        return httpx.Response(200, json=cluster, request=httpx.Request("GET", url))

    monkeypatch.setenv("LLMGW_PATRONI_URL", "http://patroni:8008/")
    monkeypatch.setattr(httpx, "get", fake_get)
    s = operator.get("/api/v1/summary").json()
    assert asked == ["http://patroni:8008/cluster"]
    assert [(m["name"], m["role"], m["lag"]) for m in s["store"]] == [
        ("pg1", "leader", 0),
        ("pg2", "replica", 4096),
        ("pg3", "replica", -1),
    ]

    def down(url, timeout):
        raise httpx.ConnectError("connection refused")

    monkeypatch.setattr(httpx, "get", down)
    s = operator.get("/api/v1/summary").json()
    assert s["store"] == [] and "could not be read: connection refused" in s["store_error"]
    assert s["nodes"]["total"] == 5, "the rest of the summary is still answered"


# The node listing: the token, problem GPUs, GPUs, IB ports (listed per node, as in the seeds), shards,
# domains, nodes. The summary also reads the autoscaler's rows, the prefetches, the open partitions and the
# models' LoRA adapters, and a node's page its held cards and health actions: one query each, whatever the
# fleet's size. The replica list reads three more while any replica is starting (their rank 0 shards, their
# models' recent starts, the nodes holding their weights), however many are starting.
# Each request asks for its account's permissions (core.access): two queries, the user's and its groups'.
QUERY_BUDGET = {"/api/v1/summary": 27, "/api/v1/nodes": 9, "/api/v1/nodes/hgx-000": 12, "/api/v1/replicas": 10}


def queries(client, path) -> int:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as seen:
        assert client.get(path).status_code == 200
    return len(seen)


@pytest.mark.parametrize("path", list(QUERY_BUDGET))
def test_a_bigger_fleet_takes_no_more_queries(operator, fleet, path, django_assert_max_num_queries):
    """No query per node, GPU or replica: growing the fleet fourfold leaves the count where it was."""
    operator.get(path)  # the token's first use of the minute writes last_used_at; count the requests after it
    before = queries(operator, path)
    model = CatalogModel.objects.get(name="llama-8b")
    for i, sim in enumerate(ingest_fleet("h100-hgx:12@south,a100-mig:3", prefix="more-")):
        if sim.kind == "h100-hgx":
            place(model, sim.name, [0, 1, 2])
            # Starting ones too: each has a start view (its shard, its model's starts, who holds its weights).
            place(model, sim.name, [4, 5], state="starting", shard_state="starting" if i % 2 else "fetching")
    assert queries(operator, path) == before
    with django_assert_max_num_queries(QUERY_BUDGET[path]):
        operator.get(path)


def test_counting_in_the_database_matches_the_node_and_replica_lists(fleet):
    """The summary counted in PostgreSQL is the specification's count over the node and replica lists."""
    from inventory.models import GPU
    from observability.fleet_summary import summary
    from placement.reads import node_list, replica_list
    from tests.observability import summary_spec

    F.gpu_lost(fleet["hgx-002"], 3)
    ingest(fleet["hgx-002"])
    Node.objects.filter(name="hgx-001").update(state="draining")
    Node.objects.filter(name="cpu-00").update(reachable=False)
    Node.objects.filter(name="hgx-000").update(weights=[{"path": "/m/a", "name": "a"}, {"path": "/m/b"}, "junk"])
    mig = Node.objects.get(name="mig-00")
    # A card carved into the instances already there, one in MIG mode with none, and one instance with its UUID.
    GPU.objects.create(node=mig, index=0, uuid="GPU-0", name="A100", gpu_class="a100-80g", mig_mode="enabled")
    GPU.objects.create(node=mig, index=1, uuid="GPU-1", name="A100", gpu_class="a100-80g", mig_mode="Enabled")
    GPU.objects.filter(node=mig, index=1001).update(mig_uuid="MIG-1")
    model = CatalogModel.objects.get(name="llama-8b")
    place(model, "mig-00", [1001, "junk"])
    now = timezone.now()
    got = summary(now)
    nodes, replicas = node_list(now), replica_list(now=now)
    assert got["nodes"] == summary_spec.node_totals(nodes)
    assert got["fabrics"] == summary_spec.fabrics(nodes)
    assert got["replicas"] == summary_spec.replica_totals(replicas)
    assert got["idle_replicas"] == summary_spec.idle(replicas)
    assert got["gpus"] and got["nodes"]["draining"] == 1 and got["nodes"]["unreachable"] == 1
