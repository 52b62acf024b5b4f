"""Placement hears the apps below it through the signals they declare, never by being imported by them."""

from __future__ import annotations

import pytest

from catalog import signals as catalog_signals
from catalog import writes as service
from catalog.models import CatalogModel
from inventory import signals as inventory_signals
from inventory.models import Node
from inventory.writes import states
from placement import signals

pytestmark = pytest.mark.django_db


@pytest.fixture
def asked(monkeypatch):
    """The reconciles placement asks for, by the reason it gives."""
    reasons: list[str] = []
    monkeypatch.setattr(signals, "reconcile_soon", reasons.append)
    return reasons


def test_placement_reconciles_when_the_catalog_or_the_inventory_says_something_changed(asked):
    catalog_signals.model_changed.send(sender=CatalogModel, name="m")
    inventory_signals.node_state_changed.send(sender=Node, name="hgx-000")
    assert asked == ["model m changed", "node hgx-000 changed"]


def test_a_node_drained_through_the_inventory_reaches_placement(asked):
    Node.objects.create(name="hgx-000")
    states.set_node_state("hgx-000", "drain", actor="olivia")
    assert asked == ["node hgx-000 changed"]


@pytest.mark.django_db(transaction=True)
def test_a_catalog_change_is_told_once_it_is_committed(asked):
    service.add_model(
        {"name": "m", "profiles": [{"name": "h100", "engine": "vllm", "gpu_class": "h100-80g"}]}, actor="olivia"
    )
    assert asked == ["model m changed"]
