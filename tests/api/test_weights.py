"""Orphaned weights: listed by one verb, collected by another, nothing a model refers to ever collected."""

from __future__ import annotations

import pytest

from catalog.models import WeightCollection
from catalog.reads import source_refers_to
from core.models import AuditEntry
from inventory.models import Node
from inventory.writes.heartbeats import desk
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


# --- a deletion asked for is re-checked until the agent acts on it ----------------------------------

OLD_URL = "https://example.org/dl/mistral-7b.Q4_K_M.gguf"


def old_refers_again(how: str) -> None:
    """A model that refers to OLD's weights arrives after they were asked to be collected."""
    definition = {"name": "mistral", "source": OLD_URL, "profiles": [{"engine": "vllm", "gpu_class": "h100-80g"}]}
    if how == "service":
        add_model(definition)
    elif how == "edit":
        add_model({**definition, "source": ""})
        from catalog import writes as service

        service.upsert_model(definition, actor="t", declared_in="store")
    else:  # a write no signal sees: only the hand-out's own check catches it
        add_model({**definition, "source": ""})
        from catalog.models import CatalogModel

        CatalogModel.objects.filter(name="mistral").update(source=OLD_URL)


def handed_out(node: str) -> list[str]:
    desk.refresh_shards()
    return desk.collections.get(node, [])


@pytest.mark.parametrize("how", ["service", "edit", "update"])
def test_weights_a_model_refers_to_again_are_not_handed_out_and_their_deletion_is_cancelled(
    operator, disks, how, django_capture_on_commit_callbacks
):
    operator.post("/api/v1/weights/collect", {}, format="json")
    assert handed_out("hgx-000") == [OLD["path"]]
    with django_capture_on_commit_callbacks(execute=True):
        old_refers_again(how)
    if how != "update":
        cancelled = WeightCollection.objects.get(path=OLD["path"])
        assert cancelled.done_at is not None, "cancelled as the model is saved, before any hand-out"
    assert handed_out("hgx-000") == [], "the agent is not told to delete what a model uses"
    row = WeightCollection.objects.get(node="hgx-000", path=OLD["path"])
    assert row.done_at is not None and "cancelled: model 'mistral' refers to" in row.error
    assert handed_out("hgx-001") == ["/models/stray"], "the others still go"


def test_collecting_again_cancels_what_a_model_now_refers_to(operator, disks):
    operator.post("/api/v1/weights/collect", {}, format="json")
    from catalog.models import CatalogModel

    add_model({"name": "stray", "source": "", "profiles": [{"engine": "vllm", "gpu_class": "h100-80g"}]})
    CatalogModel.objects.filter(name="stray").update(source="file:///models/stray")
    answer = operator.post("/api/v1/weights/collect", {}, format="json").json()
    assert [o["path"] for o in answer["orphans"]] == [OLD["path"]]
    assert WeightCollection.objects.get(path="/models/stray").error.startswith("cancelled")
