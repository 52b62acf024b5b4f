"""Rows into the scheduler's dataclasses: unknown stays unknown, lost nodes are gone, demand and parking carry over."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from catalog.definitions import ProfileSpec
from catalog.models import CatalogModel, Profile
from inventory.models import Node
from placement import snapshot
from placement.writes import demand
from tests.placement.dbfleet import fleet, gpu_profile, model

pytestmark = pytest.mark.django_db


def nodes(loaded):
    return {n.name: n for n in loaded.snapshot.nodes}


def test_nodes_carry_what_was_reported_and_unknown_stays_none():
    fleet("gb200-nvl72:1@north,h100-hgx:1@south,cpu:1")
    Node.objects.filter(name="cpu-00").update(engines=None, memory_mb=None)
    got = nodes(snapshot.load(timezone.now()))

    tray = got["nvl72-00-tray-00"]
    assert tray.imex_state == "up" and tray.imex_channels == 1
    assert {g.domain for g in tray.gpus} == {tray.gpus[0].domain} and tray.gpus[0].domain.count("/") == 1
    assert tray.fabric and tray.fabric.startswith("sm:")
    hgx = got["hgx-000"]
    assert hgx.fabric.startswith("sm:") and hgx.fabric != tray.fabric, "two subnet managers, two fabrics"
    assert hgx.imex_state is None and hgx.imex_channels is None, "not reported is not 'down'"
    assert all(g.domain is None for g in hgx.gpus), "an HGX's own NVSwitch is no domain"
    assert all(g.nvlink_peers for g in hgx.gpus) and hgx.engines == frozenset({"vllm", "sglang"})
    cpu = got["cpu-00"]
    assert cpu.engines is None and cpu.memory_mb is None and cpu.fabric is None and cpu.gpus == ()


def test_lost_nodes_are_left_out_unreachable_ones_kept_and_marked():
    fleet("h100-hgx:3")
    Node.objects.filter(name="hgx-001").update(reachable=False)
    Node.objects.filter(name="hgx-002").update(reachable=False, lost=True)
    got = nodes(snapshot.load(timezone.now()))
    assert set(got) == {"hgx-000", "hgx-001"} and got["hgx-001"].reachable is False


def test_models_carry_demand_parking_and_idle_timeout():
    fleet("h100-hgx:1")
    model("a", gpu_profile("h100-80g"), min_replicas=0, max_replicas=2, idle_timeout="15m")
    model("b", gpu_profile("h100-80g"))
    CatalogModel.objects.filter(name="b").update(parked_at=timezone.now(), parked_error="boom")
    demand.request_replica("a")
    demand.request_replica("no-such-model")

    models = {m.name: m for m in snapshot.load(timezone.now()).snapshot.models}
    assert models["a"].wanted == 1 and models["a"].idle_timeout_s == 900 and models["a"].parked_error is None
    assert models["b"].wanted is None and models["b"].parked_error == "boom"
    assert models["a"].profiles[0].fingerprint

    later = snapshot.load(timezone.now() + snapshot.DEMAND_TTL + timedelta(seconds=1))
    assert {m.name: m.wanted for m in later.snapshot.models}["a"] is None, "old demand is forgotten"


def test_the_scheduler_is_given_the_catalogs_own_profile_spec():
    """One conversion: a stored profile reaches the scheduler as Profile.spec(), its stored fingerprint with it."""
    model("a", gpu_profile("h100-80g", gpus=2, pool="gold", env={"VLLM_USE_V1": "1"}))
    Profile.objects.update(fingerprint="as-stored")
    [got] = snapshot.load(timezone.now()).snapshot.models
    assert isinstance(got.profiles[0], ProfileSpec)
    assert got.profiles == (Profile.objects.get().spec(),) and got.profiles[0].fingerprint == "as-stored"


def test_the_nodes_holding_each_models_complete_weights_reach_the_scheduler():
    fleet("h100-hgx:4")
    model("llama", gpu_profile("h100-80g"))
    CatalogModel.objects.filter(name="llama").update(source="hf://meta/llama")
    hf = {"path": "/m/models--meta--llama/snapshots/abc", "name": "meta/llama", "format": "hf-cache"}
    Node.objects.filter(name="hgx-000").update(weights=[hf])
    Node.objects.filter(name="hgx-001").update(weights=[{**hf, "incomplete": True}])
    Node.objects.filter(name="hgx-002").update(weights=[hf], lost=True)
    Node.objects.filter(name="hgx-003").update(weights=[{"path": "/m/other", "name": "other"}])
    assert snapshot.load(timezone.now()).snapshot.weights == {"llama": frozenset({"hgx-000"})}
