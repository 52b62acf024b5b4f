"""Models declared in the configuration file: loaded, kept in step, read-only, and a bad file changes nothing."""

from __future__ import annotations

import pytest

from catalog import loader
from catalog import writes as service
from catalog.models import CatalogModel
from placement.models import PlacementExplanation
from placement.writes.reconciler import reconcile
from tests.placement.dbfleet import fleet, live

pytestmark = pytest.mark.django_db

ONE = """
models:
  - name: chat
    scaling: {min: 1, max: 1}
    profiles:
      - {name: h100, engine: vllm, gpu_class: h100-80g, gpus: 1}
"""


def test_the_file_adds_redefines_and_removes_its_models(tmp_path):
    fleet("h100-hgx:1")
    path = tmp_path / "catalog.yaml"
    path.write_text(ONE)
    first = loader.load(path)
    assert first.changed == ["chat"] and not first.problems
    assert CatalogModel.objects.get(name="chat").read_only
    assert loader.load(path, last_digest=first.digest).skipped

    reconcile()
    (replica,) = live("chat")
    with pytest.raises(service.CatalogError) as refused:
        service.scale_model("chat", min_replicas=2, actor="someone")
    assert refused.value.status == 409

    path.write_text(ONE.replace("gpus: 1}", "gpus: 1, engine_args: [--enforce-eager]}"))
    assert loader.load(path).changed == ["chat"]
    reconcile()
    assert live("chat") == [replica], "a redefinition restarts nothing"
    assert PlacementExplanation.objects.get(model__name="chat").stale[0]["replica"] == replica.id

    path.write_text("models: []\n")
    assert loader.load(path).removed == ["chat"]
    assert not CatalogModel.objects.filter(name="chat").exists()


def test_a_broken_file_changes_nothing_and_says_why(tmp_path):
    path = tmp_path / "catalog.yaml"
    path.write_text(ONE)
    loader.load(path)
    path.write_text("models: [ {name: chat, profiles: [")
    result = loader.load(path)
    assert "not valid YAML" in result.problems[0]
    assert CatalogModel.objects.filter(name="chat").exists()

    path.write_text(ONE + "  - {name: bad, profiles: [{name: p, engine: nope, gpu_class: cpu}]}\n")
    result = loader.load(path)
    assert any("'bad'" in p and "engine" in p for p in result.problems), result.problems
    assert CatalogModel.objects.filter(name="chat").exists() and not CatalogModel.objects.filter(name="bad").exists()
    (tmp_path / "catalog.yaml").unlink()
    assert "cannot read" in loader.load(path).problems[0]
    assert CatalogModel.objects.filter(name="chat").exists()
