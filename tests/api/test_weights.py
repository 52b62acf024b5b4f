"""Orphaned weights: listed by one verb, collected by another, nothing a model refers to ever collected."""

from __future__ import annotations

import pytest

from catalog.views_data import source_refers_to
from inventory.models import Node
from llmgw.api.models import WeightCollection
from llmgw.core.models import AuditEntry
from tests.api.fleet import add_model, ingest_fleet

pytestmark = pytest.mark.django_db

LLAMA = {
    "path": "/models/hub/models--meta-llama--Llama-3.1-8B-Instruct/snapshots/abc",
    "format": "hf-cache",
    "bytes": 16_000,
    "name": "meta-llama/Llama-3.1-8B-Instruct",
}
OLD = {"path": "/models/old/mistral-7b.Q4_K_M.gguf", "format": "gguf", "bytes": 4_000, "name": "old/mistral-7b.Q4_K_M"}
STRAY = {"path": "/models/stray", "format": "safetensors", "bytes": 1_000, "name": "stray"}


@pytest.fixture
def disks(db):
    ingest_fleet("h100-hgx:2@north")
    add_model()
    Node.objects.filter(name="hgx-000").update(weights=[LLAMA, OLD])
    Node.objects.filter(name="hgx-001").update(weights=[STRAY])


@pytest.mark.parametrize(
    ("source", "weight", "refers"),
    [
        ("hf://meta-llama/Llama-3.1-8B-Instruct", LLAMA, True),
        ("hf://meta-llama/Llama-3.1-8B-Instruct@main", LLAMA, True),
        ("hf://meta-llama/Llama-3.1-70B-Instruct", LLAMA, False),
        ("file:///models/stray", STRAY, True),
        ("/models/stray", STRAY, True),
        ("file:///models/str", STRAY, False),
        ("https://example.org/dl/mistral-7b.Q4_K_M.gguf", OLD, True),
        ("https://example.org/dl/other.gguf", OLD, False),
        ("", OLD, False),
    ],
)
def test_which_sources_refer_to_which_weights(source, weight, refers):
    assert source_refers_to(source, weight) is refers


def test_orphans_are_the_weights_no_model_refers_to(operator, disks):
    answer = operator.get("/api/v1/weights/orphans").json()
    assert [(o["node"], o["path"]) for o in answer["orphans"]] == [
        ("hgx-000", OLD["path"]),
        ("hgx-001", "/models/stray"),
    ]
    assert (answer["weights"], answer["nodes"], answer["bytes"]) == (2, 2, 5_000)


def test_a_node_that_did_not_look_holds_no_known_orphans(operator, disks):
    Node.objects.filter(name="hgx-001").update(weights=None)
    assert [o["node"] for o in operator.get("/api/v1/weights/orphans").json()["orphans"]] == ["hgx-000"]


def test_collecting_records_each_weight_once_and_answers_what_will_go(operator, disks):
    first = operator.post("/api/v1/weights/collect", {}, format="json", HTTP_X_LLMGW_ACTOR="ana")
    assert first.status_code == 200
    body = first.json()
    assert body["weights"] == 2 and body["already_pending"] == 0 and body["requested_by"] == "ana"
    assert sorted(WeightCollection.objects.values_list("node", "path")) == [
        ("hgx-000", OLD["path"]),
        ("hgx-001", "/models/stray"),
    ]
    again = operator.post("/api/v1/weights/collect", format="json").json()
    assert again["already_pending"] == 2 and WeightCollection.objects.count() == 2
    assert AuditEntry.objects.filter(action="collect-weights").count() == 2


def test_collecting_on_named_nodes_only(operator, disks):
    answer = operator.post("/api/v1/weights/collect", {"nodes": ["hgx-001"]}, format="json").json()
    assert [o["node"] for o in answer["orphans"]] == ["hgx-001"]
    assert list(WeightCollection.objects.values_list("node", flat=True)) == ["hgx-001"]


@pytest.mark.parametrize(
    ("body", "status", "says"),
    [({"nodes": "hgx-001"}, 400, "list of node names"), ({"nodes": ["nope"]}, 404, "no node named 'nope'")],
)
def test_collect_refusals(operator, disks, body, status, says):
    answer = operator.post("/api/v1/weights/collect", body, format="json")
    assert answer.status_code == status and says in answer.json()["error"]
    assert not WeightCollection.objects.exists()
