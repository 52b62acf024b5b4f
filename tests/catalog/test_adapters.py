"""LoRA adapters in the catalog: declared on a base model in YAML, the API, the admin and ctl; every name unique."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError
from hypothesis import given
from hypothesis import strategies as st

from catalog import loader
from catalog import writes as service
from catalog.definitions import SOURCE_MAX, parse_definition
from catalog.models import Adapter, Alias, CatalogModel

SQL = {"name": "llama-sql", "source": "hf://acme/llama-sql-lora"}


def definition(name="llama-8b", **extra):
    return {
        "name": name,
        "source": "hf://meta-llama/Llama-3.1-8B-Instruct",
        "profiles": [{"name": "h100", "engine": "vllm", "gpu_class": "h100-80g"}],
        **extra,
    }


@pytest.mark.parametrize(
    ("adapters", "said"),
    [
        ("llama-sql", "adapters must be a list"),
        ([{"name": "bad name", "source": "hf://x"}], "adapter name 'bad name' must start"),
        ([{"name": "ok"}], "adapters[0].source is missing"),
        ([{"name": "ok", "source": "s3://b/x"}], "must start with one of hf://"),
        ([{"name": "ok", "source": "hf://" + "x" * SOURCE_MAX}], f"at most {SOURCE_MAX} are kept"),
        ([{"name": "ok", "source": "hf://x", "rank": 8}], "unknown field 'rank'"),
        ([SQL, SQL], "adapter name 'llama-sql' is used twice"),
        ([{"name": "llama-8b", "source": "hf://x"}], "is the model's own name"),
        ([{"name": "llama", "source": "hf://x"}], "is one of the model's aliases"),
    ],
)
def test_a_bad_adapter_is_refused_with_a_sentence(adapters, said):
    spec, problems = parse_definition(definition(aliases=["llama"], adapters=adapters))
    assert spec is None and any(said in p for p in problems), problems


@given(st.lists(st.fixed_dictionaries({"name": st.text(max_size=20), "source": st.text(max_size=30)}), max_size=4))
def test_any_adapter_list_is_parsed_or_refused_never_raises(adapters):
    spec, problems = parse_definition(definition(adapters=adapters))
    assert (spec is None) == bool(problems)
    if spec is not None:
        assert len({a.name for a in spec.adapters}) == len(adapters)


@pytest.mark.django_db
def test_adapters_are_written_read_back_and_replaced_in_place():
    model = service.add_model(definition(adapters=[SQL]), actor="olive")
    assert service.model_definition(model)["adapters"] == [SQL]
    adapter = Adapter.objects.get(name="llama-sql")
    chat = {"name": "llama-chat", "source": "file:///adapters/chat"}
    moved = {**SQL, "source": "file:///adapters/sql"}
    loader_like, changed = service.upsert_model(
        definition(adapters=[moved, chat]), actor="file", declared_in=model.declared_in
    )
    assert changed and Adapter.objects.get(name="llama-sql").pk == adapter.pk, "kept by name (its price with it)"
    assert service.model_definition(loader_like)["adapters"] == [chat, moved]
    service.upsert_model(definition(), actor="file", declared_in=model.declared_in)
    assert not Adapter.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("second", "said"),
    [
        (definition("other", adapters=[{"name": "llama-8b", "source": "hf://x"}]), "already the name of another model"),
        (definition("other", adapters=[{"name": "llama", "source": "hf://x"}]), "already an alias of model llama-8b"),
        (definition("other", adapters=[SQL]), "adapter 'llama-sql' is already an adapter of model llama-8b"),
        (definition("llama-sql"), "model name 'llama-sql' is already an adapter of model llama-8b"),
        (definition("other", aliases=["llama-sql"]), "alias 'llama-sql' is already an adapter"),
    ],
)
def test_an_adapter_name_collides_with_no_model_alias_or_adapter_and_nothing_stored_is_lost(second, said):
    service.add_model(definition(aliases=["llama"], adapters=[SQL]), actor="olive")
    with pytest.raises(service.CatalogError) as refused:
        service.add_model(second, actor="olive")
    assert refused.value.status == 409 and said in refused.value.message
    assert list(CatalogModel.objects.values_list("name", flat=True)) == ["llama-8b"]
    assert list(Adapter.objects.values_list("name", "model__name")) == [("llama-sql", "llama-8b")]


@pytest.mark.django_db
def test_the_admin_checks_an_adapter_against_every_name():
    model = service.add_model(definition(aliases=["llama"], adapters=[SQL]), actor="olive")
    for name, said in [("llama-8b", "name of a model"), ("llama", "already an alias"), ("llama-sql", "already exists")]:
        with pytest.raises(ValidationError, match=said):
            Adapter(model=model, name=name, source="hf://x").full_clean()
    with pytest.raises(ValidationError, match="must start with one of"):
        Adapter(model=model, name="fine", source="ftp://x").full_clean()
    with pytest.raises(ValidationError, match="adapter"):
        CatalogModel(name="llama-sql").clean()
    with pytest.raises(ValidationError, match="adapter"):
        Alias(model=model, name="llama-sql").clean()


@pytest.mark.django_db
def test_the_yaml_file_declares_adapters_and_a_colliding_one_is_reported_not_stored(tmp_path):
    path = tmp_path / "catalog.yaml"
    path.write_text(
        "models:\n"
        "  - name: llama-8b\n"
        "    profiles: [{name: h100, engine: vllm, gpu_class: h100-80g}]\n"
        "    adapters: [{name: llama-sql, source: 'hf://acme/llama-sql-lora'}]\n"
        "  - name: qwen\n"
        "    profiles: [{name: h100, engine: vllm, gpu_class: h100-80g}]\n"
        "    adapters: [{name: llama-sql, source: 'hf://acme/other'}]\n"
    )
    result = loader.load(path)
    assert result.changed == ["llama-8b"]
    assert any("'llama-sql' is already an adapter of model llama-8b" in p for p in result.problems)
    assert list(Adapter.objects.values_list("name", "source")) == [("llama-sql", "hf://acme/llama-sql-lora")]
    assert loader.load(path, result.digest).skipped
    again = loader.load(path)
    assert again.changed == [], "adapters read back as written: an unchanged file changes nothing"
