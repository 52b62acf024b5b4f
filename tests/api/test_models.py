"""The catalog through the API: list, add, remove, scale, and measured capacity — each change audited."""

from __future__ import annotations

import pytest

from catalog.models import CapacityMeasurement, CatalogModel
from core.models import AuditEntry
from tests.api.fleet import MODEL, add_model, ingest_fleet, place

pytestmark = pytest.mark.django_db

CPU_MODEL = {
    "name": "qwen-0.5b",
    "source": "https://example.org/qwen2.5-0.5b-instruct-q4_k_m.gguf",
    "scaling": {"min": 0, "max": 1, "idle_timeout": "30m"},
    "profiles": [{"name": "cpu", "engine": "llamacpp", "gpu_class": "cpu", "memory_gb": 2, "gpus": 0}],
}


@pytest.fixture
def fleet(db):
    ingest_fleet("h100-hgx:1@north")
    model = add_model()
    place(model, "hgx-000", [0])
    return model


def test_the_list_shows_scaling_profiles_and_replicas(operator, fleet):
    [model] = operator.get("/api/v1/models").json()
    assert model["name"] == "llama-8b" and model["aliases"] == ["llama"]
    assert (model["min_replicas"], model["max_replicas"], model["ready_replicas"], model["total_replicas"]) == (
        1,
        2,
        1,
        1,
    )
    assert model["profiles"] == ["h100"]
    assert model["profile_specs"] == [
        {"name": "h100", "engine": "vllm", "gpu_class": "h100-80g", "gpus": 1, "nodes": 1, "tp": 1, "pp": 1}
    ]
    assert not model["parked"] and not model["read_only"] and "idle_timeout_seconds" not in model


def test_adding_a_model_answers_it_and_audits_the_actor(operator, fleet):
    answer = operator.post("/api/v1/models", CPU_MODEL, format="json", HTTP_X_LLMGW_ACTOR="ana")
    assert answer.status_code == 201, answer.content
    body = answer.json()
    assert body["name"] == "qwen-0.5b" and body["on_demand"] and body["idle_timeout_seconds"] == 1800
    assert AuditEntry.objects.get(action="add-model", target="qwen-0.5b").actor == "ana"


def test_a_model_for_hardware_nobody_has_is_added_with_a_warning(operator, fleet):
    definition = {
        **MODEL,
        "name": "big",
        "aliases": [],
        "profiles": [{**MODEL["profiles"][0], "gpu_class": "b200-180g"}],
    }
    answer = operator.post("/api/v1/models", definition, format="json")
    assert answer.status_code == 201 and "b200-180g" in answer["X-Llmgw-Warning"]


@pytest.mark.parametrize(
    ("definition", "status", "says"),
    [
        ({**MODEL}, 409, "already exists"),
        ({**CPU_MODEL, "profils": []}, 400, "profils"),
        ({**CPU_MODEL, "name": "llama"}, 409, "already"),
        ({**CPU_MODEL, "fallbacks": ["nope"]}, 400, "fallback 'nope'"),
        ({**CPU_MODEL, "scaling": {"min": 10**30}}, 400, ""),
    ],
)
def test_a_wrong_definition_is_refused_with_what_to_fix(operator, fleet, definition, status, says):
    answer = operator.post("/api/v1/models", definition, format="json")
    assert answer.status_code == status, answer.content
    assert says in answer.json()["error"]
    assert CatalogModel.objects.count() == 1


def test_removing_a_model(operator, fleet):
    operator.post("/api/v1/models", CPU_MODEL, format="json")
    answer = operator.delete("/api/v1/models/qwen-0.5b")
    assert answer.status_code == 200 and answer.json() == {"removed": "qwen-0.5b"}
    assert not CatalogModel.objects.filter(name="qwen-0.5b").exists()
    assert AuditEntry.objects.filter(action="remove-model", actor="olivia").exists()
    assert operator.delete("/api/v1/models/qwen-0.5b").status_code == 404


def test_a_model_from_the_configuration_file_is_read_only(operator, fleet):
    CatalogModel.objects.filter(name="llama-8b").update(declared_in="file")
    removed = operator.delete("/api/v1/models/llama-8b")
    assert removed.status_code == 409 and "configuration file" in removed.json()["error"]
    scaled = operator.post("/api/v1/models/llama-8b/scale", {"min": 2}, format="json")
    assert scaled.status_code == 409


def test_scaling_answers_what_is_now_in_force(operator, fleet):
    answer = operator.post("/api/v1/models/llama/scale", {"min": 0, "max": 3, "idle_timeout": "1h30m"}, format="json")
    assert answer.status_code == 200, answer.content
    assert answer.json() == {"model": "llama-8b", "min": 0, "max": 3, "on_demand": True, "idle_timeout_seconds": 5400}
    again = operator.post("/api/v1/models/llama-8b/scale", {"min": 2, "idle_timeout": None}, format="json").json()
    assert again == {"model": "llama-8b", "min": 2, "max": 2, "on_demand": False}
    entry = AuditEntry.objects.filter(action="scale").first()
    assert entry.detail["min"] == 2 and entry.actor == "olivia"


def test_scaling_unparks_a_parked_model(operator, fleet):
    from django.utils import timezone

    CatalogModel.objects.filter(name="llama-8b").update(parked_at=timezone.now(), parked_error="OOM", failure_streak=5)
    assert operator.get("/api/v1/models").json()[0]["parked_error"] == "OOM"
    operator.post("/api/v1/models/llama-8b/scale", {"min": 1}, format="json")
    assert CatalogModel.objects.get(name="llama-8b").parked_at is None


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({}, "min must be a whole number"),
        ({"min": -1}, "between 0 and"),
        ({"min": "2"}, "whole number"),
        ({"min": True}, "whole number"),
        ({"min": 3, "max": 1}, "max"),
        ({"min": 1, "idle_timeout": "soon"}, "idle_timeout must be a duration"),
        ({"min": 1, "idle_timeout": 10**20}, "idle_timeout"),
        ({"min": 10**12}, "between 0 and"),
    ],
)
def test_a_wrong_scale_says_what_to_fix(operator, fleet, body, says):
    answer = operator.post("/api/v1/models/llama-8b/scale", body, format="json")
    assert answer.status_code == 400, answer.content
    assert says in answer.json()["error"]
    assert CatalogModel.objects.get(name="llama-8b").min_replicas == 1


def test_scaling_an_unknown_model_is_a_404(operator, fleet):
    assert operator.post("/api/v1/models/nope/scale", {"min": 1}, format="json").status_code == 404


# --- capacity ---


def test_a_measurement_is_stored_replaced_and_listed(operator, fleet):
    first = operator.put("/api/v1/models/llama/capacity", {"profile": "h100", "tokens_per_second": 900}, format="json")
    assert first.status_code == 200, first.content
    assert first.json()["model"] == "llama-8b" and first.json()["measurement"] == {"tokens_per_second": 900}
    operator.put(
        "/api/v1/models/llama-8b/capacity",
        {"profile": "h100", "tokens_per_second": 1200, "measured_at": "2026-10-05T14:00:00Z"},
        format="json",
        HTTP_X_LLMGW_ACTOR="bench-runner",
    )
    [row] = operator.get("/api/v1/capacity").json()
    assert row["measurement"] == {"tokens_per_second": 1200} and row["measured_by"] == "bench-runner"
    assert row["measured_at"].startswith("2026-10-05T14:00:00")
    assert AuditEntry.objects.filter(action="put-capacity").count() == 2


def test_a_measurement_outlives_its_model(operator, fleet):
    operator.put("/api/v1/models/llama-8b/capacity", {"profile": "h100", "rps": 3}, format="json")
    CatalogModel.objects.all().delete()
    assert CapacityMeasurement.objects.count() == 1 and len(operator.get("/api/v1/capacity").json()) == 1


@pytest.mark.parametrize(
    ("path", "body", "status", "says"),
    [
        ("llama-8b", {"rps": 3}, 400, "needs the profile"),
        ("llama-8b", {"profile": "a100"}, 400, "no profile named 'a100' (its profiles: h100)"),
        ("lama-8b", {"profile": "h100"}, 404, "no model named 'lama-8b'"),
        ("llama-8b", {"profile": "h100", "measured_at": "yesterday"}, 400, "measured_at"),
        ("llama-8b", {"profile": "h100", "measured_at": "2026-13-45T99:00:00"}, 400, "measured_at"),
    ],
)
def test_a_wrong_measurement_says_what_to_fix(operator, fleet, path, body, status, says):
    answer = operator.put(f"/api/v1/models/{path}/capacity", body, format="json")
    assert answer.status_code == status and says in answer.json()["error"]
    assert not CapacityMeasurement.objects.exists()
