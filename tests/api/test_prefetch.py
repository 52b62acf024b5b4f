"""Prefetching a model's weights: asked through the API and ctl, handed to the agent, its progress stored and shown.

The whole path on the database: the request records a row per node; the
heartbeat desk's answer hands it to that node's agent; the agent's beats of
progress, flushed, move the row; the models list and ``ctl models`` show it;
a prefetched copy is no orphan while its model exists.
"""

from __future__ import annotations

import json

import pytest
from django.utils import timezone

from catalog.models import CatalogModel, WeightCollection, WeightPrefetch
from core.models import ApiToken, AuditEntry
from inventory.models import Node
from inventory.report_schema import heartbeat_problems
from inventory.writes.heartbeats import HeartbeatDesk
from tests import people
from tests.api.fleet import add_model, ingest_fleet
from tests.ctl.transport import DjangoTransport, run

pytestmark = pytest.mark.django_db

SOURCE = "hf://meta-llama/Llama-3.1-8B-Instruct"
SNAPSHOT = "/models/hf/models--meta-llama--Llama-3.1-8B-Instruct/snapshots/abc"
HELD = {"path": SNAPSHOT, "format": "hf-cache", "bytes": 16_000, "name": "meta-llama/Llama-3.1-8B-Instruct"}


@pytest.fixture
def fleet(db):
    ingest_fleet("h100-hgx:3@north")
    Node.objects.filter(name="hgx-002").update(labels={"pool": "gold"})
    return add_model()


@pytest.fixture
def desk(fleet):
    """A fresh heartbeat desk that knows hgx-000 as its agent would reach it."""
    d = HeartbeatDesk()
    node = Node.objects.get(name="hgx-000")
    Node.objects.filter(pk=node.pk).update(credential_digest="digest-0")
    node.credential_digest = "digest-0"
    d.remember(node)
    return d, d.nodes["digest-0"]


def prefetch(operator, body: dict, model: str = "llama-8b"):
    return operator.post(f"/api/v1/models/{model}/prefetch", body, format="json", HTTP_X_LLMGW_ACTOR="ana")


def shown(operator) -> list[dict]:
    (llama,) = [m for m in operator.get("/api/v1/models").json() if m["name"] == "llama-8b"]
    return llama.get("prefetch", [])


def test_a_prefetch_goes_to_the_agent_and_its_progress_comes_back_and_shows(operator, desk):
    d, ref = desk
    answer = prefetch(operator, {"nodes": ["hgx-000"]})
    assert answer.status_code == 200, answer.json()
    assert [(p["node"], p["state"], p["requested_by"]) for p in answer.json()["prefetch"]] == [
        ("hgx-000", "requested", "ana")
    ]
    assert AuditEntry.objects.filter(action="prefetch-weights", target="llama-8b").count() == 1

    d.refresh_shards()
    handed = d.accept(ref, {}, timezone.now())
    assert handed["prefetch"] == [{"model": "llama-8b", "source": SOURCE}]

    progress = {"model": "llama-8b", "source": SOURCE, "state": "fetching", "bytes_done": 4_000, "bytes_total": 16_000}
    d.accept(ref, {"prefetch": [progress]}, timezone.now())
    d.flush()
    (row,) = shown(operator)
    assert (row["state"], row["bytes_done"], row["bytes_total"]) == ("fetching", 4_000, 16_000)

    done = {**progress, "state": "done", "bytes_done": 16_000, "path": SNAPSHOT}
    d.accept(ref, {"prefetch": [done]}, timezone.now())
    d.flush()
    (row,) = shown(operator)
    assert row["state"] == "done" and row["path"] == SNAPSHOT and "done_at" in row
    d.refresh_shards()
    assert "prefetch" not in d.accept(ref, {}, timezone.now()), "a finished prefetch is handed out no more"


def test_a_failed_prefetch_says_why_and_asking_again_starts_it_over(operator, desk):
    d, ref = desk
    prefetch(operator, {"nodes": ["hgx-000"]})
    failed = {"model": "llama-8b", "source": SOURCE, "state": "failed", "error": "hf:// needs huggingface_hub"}
    d.accept(ref, {"prefetch": [failed]}, timezone.now())
    d.flush()
    (row,) = shown(operator)
    assert row["state"] == "failed" and row["error"] == "hf:// needs huggingface_hub"
    prefetch(operator, {"nodes": ["hgx-000"]})
    (row,) = shown(operator)
    assert row["state"] == "requested" and "error" not in row
    assert WeightPrefetch.objects.count() == 1


def test_a_report_for_another_source_does_not_move_the_row(operator, desk):
    d, ref = desk
    prefetch(operator, {"nodes": ["hgx-000"]})
    stale = {"model": "llama-8b", "source": "hf://old/one", "state": "done", "path": "/x"}
    d.accept(ref, {"prefetch": [stale]}, timezone.now())
    d.flush()
    assert shown(operator)[0]["state"] == "requested"


def test_a_pool_a_count_or_named_nodes(operator, fleet):
    assert [p["node"] for p in prefetch(operator, {"pool": "gold"}).json()["prefetch"]] == ["hgx-002"]
    Node.objects.filter(name="hgx-000").update(weights=[HELD])
    # hgx-000 holds the weights and hgx-002 has a prefetch under way: a count takes the others first.
    assert [p["node"] for p in prefetch(operator, {"count": 1}).json()["prefetch"]] == ["hgx-001"]
    assert prefetch(operator, {"count": 5}).status_code == 409, "every node holds or is fetching them"


@pytest.mark.parametrize(
    ("model", "body", "status", "words"),
    [
        ("nope", {"nodes": ["hgx-000"]}, 404, "no model named 'nope'"),
        ("llama-8b", {}, 400, "say where"),
        ("llama-8b", {"nodes": ["hgx-009"]}, 404, "no node named 'hgx-009'"),
        ("llama-8b", {"nodes": "hgx-000"}, 400, "nodes must be a list"),
        ("llama-8b", {"nodes": ["hgx-000"], "pool": "gold"}, 400, "not both"),
        ("llama-8b", {"pool": "silver"}, 404, "no node is in pool 'silver'"),
        ("llama-8b", {"count": 0}, 400, "count must be between 1"),
        ("llama-8b", {"count": "2"}, 400, "count must be a whole number"),
    ],
)
def test_bad_requests_get_a_sentence(operator, fleet, model, body, status, words):
    answer = prefetch(operator, body, model)
    assert answer.status_code == status and words in answer.json()["error"], answer.json()
    assert WeightPrefetch.objects.count() == 0


def test_a_model_without_a_source_has_nothing_to_prefetch(operator, fleet):
    CatalogModel.objects.filter(name="llama-8b").update(source="")
    answer = prefetch(operator, {"nodes": ["hgx-000"]})
    assert answer.status_code == 409 and "has no source" in answer.json()["error"]


def test_a_reader_may_not_prefetch(reader, fleet):
    assert prefetch(reader, {"nodes": ["hgx-000"]}).status_code == 403


def test_prefetched_copies_are_no_orphans_while_the_model_exists(operator, desk):
    d, ref = desk
    prefetch(operator, {"nodes": ["hgx-000"]})
    d.accept(
        ref, {"prefetch": [{"model": "llama-8b", "source": SOURCE, "state": "done", "path": SNAPSHOT}]}, timezone.now()
    )
    d.flush()
    Node.objects.filter(name="hgx-000").update(weights=[HELD])
    # The model's source moves on: the copy it asked for stays claimed while the model exists.
    CatalogModel.objects.filter(name="llama-8b").update(source="hf://meta-llama/Llama-3.2-3B")
    assert operator.get("/api/v1/weights/orphans").json()["orphans"] == []
    WeightCollection.objects.create(node="hgx-000", path=SNAPSHOT, requested_by="t")
    d.refresh_shards()
    assert "collect" not in d.accept(ref, {}, timezone.now()), "a prefetched copy is never handed out to delete"
    assert "prefetched for a model" in WeightCollection.objects.get().error
    assert operator.delete("/api/v1/models/llama-8b").status_code == 200
    assert [o["path"] for o in operator.get("/api/v1/weights/orphans").json()["orphans"]] == [SNAPSHOT]


def test_ctl_prefetch_and_ctl_models_show_the_progress(fleet, monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    _, secret = ApiToken.issue(people.operator("olivia"), "laptop")
    monkeypatch.setenv("LLMGW_TOKEN", secret)
    transport = DjangoTransport()
    code, out, err = run(["prefetch", "llama", "--nodes", "hgx-000,hgx-001"], transport)
    assert code == 0, err
    assert "prefetching llama-8b onto hgx-000, hgx-001" in out
    WeightPrefetch.objects.filter(node="hgx-000").update(
        updated_at=timezone.now(), bytes_done=4_000_000_000, bytes_total=16_000_000_000
    )
    code, out, _ = run(["models"], transport)
    out = " ".join(out.split())
    assert code == 0 and "llama-8b weights on hgx-000: fetching, 25% of 16.0 GB" in out, out
    assert "llama-8b weights on hgx-001: requested" in out
    code, out, err = run(["prefetch", "llama-8b"], transport)
    assert code != 0 and "say where" in err
    listed = json.loads(run(["prefetch", "llama-8b", "--count", "1", "--json"], transport)[1])
    assert [p["node"] for p in listed["prefetch"]] == ["hgx-002"]


def test_a_beat_whose_prefetch_names_no_model_is_refused():
    assert heartbeat_problems({"prefetch": [{"state": "done"}]}) == [
        "heartbeat.prefetch must be a list of objects naming the model being fetched"
    ]
    assert heartbeat_problems({"prefetch": [{"model": "m", "state": "fetching", "bytes_done": 1}]}) == []
