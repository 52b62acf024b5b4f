"""LoRA adapters through the admin API and ctl: declared on a model, shown with it, refused with a 4xx sentence."""

from __future__ import annotations

import json

import pytest

from catalog.models import Adapter, CatalogModel
from core.models import ApiToken
from inventory.models import Node
from tests import people
from tests.api.fleet import ingest_fleet
from tests.ctl.transport import DjangoTransport, run

pytestmark = pytest.mark.django_db

SQL = {"name": "llama-sql", "source": "hf://acme/llama-sql-lora"}


def definition(name="llama-8b", **extra):
    return {"name": name, "profiles": [{"name": "h100", "engine": "vllm", "gpu_class": "h100-80g"}], **extra}


def test_a_model_is_added_with_its_adapters_and_listed_with_them(operator):
    answer = operator.post("/api/v1/models", definition(adapters=[SQL]), format="json")
    assert answer.status_code == 201, answer.content
    assert answer.json()["adapters"] == [SQL]
    assert operator.get("/api/v1/models").json()[0]["adapters"] == [SQL]


@pytest.mark.parametrize(
    ("body", "status", "said"),
    [
        (definition("qwen", adapters=[SQL]), 409, "already an adapter of model llama-8b"),
        (definition("llama-sql"), 409, "already an adapter of model llama-8b"),
        (definition("qwen", adapters=[{"name": "llama-8b", "source": "hf://x"}]), 409, "name of another model"),
        (definition("qwen", adapters=[{"name": "../etc", "source": "hf://x"}]), 400, "must start with a letter"),
        (definition("qwen", adapters=[{"name": "q", "source": "hf://" + "x" * 600}]), 400, "at most 500"),
        (definition("qwen", adapters={"name": "q"}), 400, "adapters must be a list"),
        (definition("qwen", adapters=[{"name": "q\u0000", "source": "hf://x"}]), 400, ""),
    ],
)
def test_hostile_adapters_are_refused_with_a_sentence_and_nothing_stored_is_lost(operator, body, status, said):
    assert operator.post("/api/v1/models", definition(adapters=[SQL]), format="json").status_code == 201
    answer = operator.post("/api/v1/models", body, format="json")
    assert answer.status_code == status, answer.content
    assert said in json.dumps(answer.json())
    assert list(CatalogModel.objects.values_list("name", flat=True)) == ["llama-8b"]
    assert list(Adapter.objects.values_list("name", "source")) == [(SQL["name"], SQL["source"])]


def test_ctl_adds_a_model_with_adapters_from_yaml_and_lists_them(db, monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    _, secret = ApiToken.issue(people.operator("olivia"), "laptop")
    monkeypatch.setenv("LLMGW_TOKEN", secret)
    transport = DjangoTransport()
    path = tmp_path / "llama.yaml"
    path.write_text(
        "name: llama-8b\nprofiles: [{name: h100, engine: vllm, gpu_class: h100-80g}]\n"
        "adapters: [{name: llama-sql, source: 'hf://acme/llama-sql-lora'}]\n"
    )
    code, out, _ = run(["add-model", str(path)], transport)
    assert code == 0, out
    code, out, _ = run(["models"], transport)
    assert code == 0 and "llama-8b adapters: llama-sql" in " ".join(out.split())


def test_an_adapters_weights_on_a_node_are_no_orphans(operator):
    ingest_fleet("h100-hgx:1@north")
    lora = {"path": "/models/hub/models--acme--llama-sql-lora/snapshots/1", "name": "acme/llama-sql-lora"}
    Node.objects.filter(name="hgx-000").update(weights=[lora])
    assert [o["path"] for o in operator.get("/api/v1/weights/orphans").json()["orphans"]] == [lora["path"]]
    assert operator.post("/api/v1/models", definition(adapters=[SQL]), format="json").status_code == 201
    assert operator.get("/api/v1/weights/orphans").json()["orphans"] == []
