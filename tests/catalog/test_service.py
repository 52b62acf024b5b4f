"""The catalog service: the path every writer shares."""

from __future__ import annotations

from datetime import timedelta

import pytest

from catalog import rules
from catalog import writes as service
from catalog.definitions import parse_definition
from catalog.models import CatalogModel, DeclaredIn, Profile
from core.models import AuditEntry
from inventory.models import GPU, Node

pytestmark = pytest.mark.django_db


def definition(name="llama-8b", **extra):
    return {
        "name": name,
        "source": "hf://meta-llama/Llama-3.1-8B-Instruct",
        "profiles": [{"name": "h100", "engine": "vllm", "gpu_class": "h100-80g"}],
        **extra,
    }


def test_adding_writes_every_row_and_the_audit_log():
    model = service.add_model(definition(aliases=["llama"]), actor="olive")
    assert model.profiles.get().fingerprint
    assert service.resolve("llama") == model
    entry = AuditEntry.objects.get()
    assert (entry.actor, entry.action, entry.target) == ("olive", "add-model", "llama-8b")
    assert service.model_definition(model)["aliases"] == ["llama"]


def test_a_class_nobody_has_reported_is_a_warning_not_a_refusal():
    model = service.add_model(definition(), actor="olive")
    assert model.warnings == ["no node has reported a h100-80g GPU yet; profiles using it wait for one"]
    node = Node.objects.create(name="n")
    GPU.objects.create(node=node, index=0, uuid="u", name="H100", gpu_class="h100-80g")
    assert service.add_model(definition("other"), actor="olive").warnings == []


@pytest.mark.parametrize(
    ("first", "second", "status", "words"),
    [
        (definition(), definition(), 409, "already exists"),
        (definition(aliases=["llama"]), definition("other", aliases=["llama"]), 409, "already an alias of"),
        (definition(), definition("other", aliases=["llama-8b"]), 409, "already the name of another model"),
        (definition(), definition("other", fallbacks=["missing"]), 400, "not in the catalog"),
        (definition(), {"name": "x"}, 400, "at least one way"),
    ],
)
def test_refusals(first, second, status, words):
    service.add_model(first, actor="olive")
    with pytest.raises(service.CatalogError) as info:
        service.add_model(second, actor="olive")
    assert info.value.status == status and words in info.value.message


def test_fallback_loops_are_refused():
    service.add_model(definition("a"), actor="o")
    service.add_model(definition("b", fallbacks=["a"]), actor="o")
    with pytest.raises(service.CatalogError, match="loop back"):
        service.upsert_model(definition("a", fallbacks=["b"]), actor="o", declared_in=DeclaredIn.STORE)


def test_scaling_sets_the_range_and_unparks():
    model = service.add_model(definition(), actor="o")
    CatalogModel.objects.filter(pk=model.pk).update(parked_at=model.created_at, parked_error="boom", failure_streak=3)
    scaled = service.scale_model("llama-8b", min_replicas=0, idle_timeout=timedelta(minutes=5), actor="o")
    assert (scaled.min_replicas, scaled.max_replicas) == (0, 1)
    assert scaled.parked_at is None and scaled.failure_streak == 0
    with pytest.raises(service.CatalogError, match="below min"):
        service.scale_model("llama-8b", min_replicas=3, max_replicas=1, actor="o")
    with pytest.raises(service.CatalogError) as info:
        service.scale_model("nope", min_replicas=1, actor="o")
    assert info.value.status == 404


def test_file_declared_models_change_only_through_the_file():
    service.upsert_model(definition(), actor="file", declared_in=DeclaredIn.FILE)
    for attempt in (
        lambda: service.scale_model("llama-8b", min_replicas=2, actor="o"),
        lambda: service.remove_model("llama-8b", actor="o"),
    ):
        with pytest.raises(service.CatalogError) as info:
            attempt()
        assert info.value.status == 409 and "configuration file" in info.value.message


def test_redefining_keeps_profiles_so_replicas_can_be_judged_stale():
    service.upsert_model(definition(), actor="file", declared_in=DeclaredIn.FILE)
    profile = Profile.objects.get()
    _, changed = service.upsert_model(definition(), actor="file", declared_in=DeclaredIn.FILE)
    assert changed is False
    edited = definition()
    edited["profiles"][0]["engine_args"] = ["--max-model-len", "8192"]
    _, changed = service.upsert_model(edited, actor="file", declared_in=DeclaredIn.FILE)
    after = Profile.objects.get()
    assert changed and after.pk == profile.pk and after.fingerprint != profile.fingerprint


def test_a_model_others_fall_back_to_cannot_be_removed_first():
    service.add_model(definition("small"), actor="o")
    service.add_model(definition("big", fallbacks=["small"]), actor="o")
    with pytest.raises(service.CatalogError, match="fallback of big"):
        service.remove_model("small", actor="o")
    service.remove_model("big", actor="o")
    service.remove_model("small", actor="o")
    assert not CatalogModel.objects.exists()


# --- one spec type for a profile ---


def test_a_stored_profile_reads_back_as_the_spec_it_was_written_from():
    """Profile.spec() is the one way from a row to the spec: what was parsed is what is read."""
    written = definition()
    written["profiles"] = [
        {
            "name": "h100",
            "engine": "vllm",
            "gpu_class": "h100-80g",
            "gpus": 2,
            "tp": 2,
            "pool": "gold",
            "engine_args": ["--max-model-len", "8192"],
            "env": {"VLLM_USE_V1": "1", "OMP_NUM_THREADS": "4"},
        },
        {"name": "cpu", "engine": "llamacpp", "gpu_class": "cpu", "gpus": 0, "memory_gb": 8},
    ]
    model = service.add_model(written, actor="olive")
    parsed, _ = parse_definition(written)
    stored = [p.spec() for p in model.profiles.order_by("position")]
    assert stored == list(parsed.profiles)
    assert all(s.fingerprint == p.fingerprint for s, p in zip(stored, model.profiles.order_by("position"), strict=True))


def test_the_fingerprint_is_taken_over_the_spec_and_kept_with_the_row():
    model = service.add_model(definition(), actor="olive")
    profile = model.profiles.get()
    assert profile.fingerprint == rules.fingerprint(profile.spec().definition())
    Profile.objects.filter(pk=profile.pk).update(fingerprint="stored")
    assert Profile.objects.get().spec().fingerprint == "stored", "the row's fingerprint, not one taken again"


def test_a_row_takes_a_spec_back_whole():
    """Profile.take is the inverse of Profile.spec: what a row takes is what it reads back."""
    spec, _ = parse_definition(
        definition(
            profiles=[
                {"name": "p", "engine": "vllm", "gpu_class": "h100-80g", "env": {"OMP_NUM_THREADS": "4"}, "pool": "x"}
            ]
        )
    )
    row = Profile()
    row.take(spec.profiles[0])
    assert row.spec() == spec.profiles[0] and row.env == {"OMP_NUM_THREADS": "4"} and row.engine_args == []
