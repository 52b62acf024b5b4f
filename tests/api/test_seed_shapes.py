"""The listings keep the field names and types the seeds' ``ctl`` reads, and stay a fixed number of queries.

The expected shapes are written out by hand from the seeds' Go structs in
``shared/seeds/000_80180831cdb4a72e.txt`` (``internal/control/adminapi``):
``NodeView``, ``GPUView``, ``IBPortView``, ``LoadView`` and ``ModelView``.
A Go ``int``/``int64`` is an int here, ``float64`` a float (or an int: JSON has
one number), ``string`` a str, ``bool`` a bool, ``[]T`` a list, a map a dict,
and ``*T`` an object. A field without ``omitempty`` must always be present;
one with it may be absent (the agent did not say), never of another type.
llmgw's own fields sit beside these and are not checked here.
"""

from __future__ import annotations

import gc
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from inventory.models import Node
from inventory.reads.nodes import go_duration
from placement.reads import node_list
from tests.api.fleet import add_model, ingest_fleet, place

pytestmark = pytest.mark.django_db

NUMBER = (int, float)

# NodeView: name → (type, always present). Seed lines "type NodeView struct { … }".
NODE = {
    "id": (str, True),
    "hostname": (str, False),
    "mgmt_addr": (str, False),
    "state": (str, True),
    "labels": (dict, False),
    "gpu_total": (int, True),
    "gpu_free": (int, True),
    "memory_gb": (int, False),
    "engines": (list, False),
    "os": (str, False),
    "warnings": (list, False),
    "models_on_disk": (list, False),
    "disk_free_gb": (int, False),
    "disk_total_gb": (int, False),
    "gpu_classes": (list, False),
    "fabrics": (list, False),
    "unhealthy_gpus": (list, False),
    "last_seen_ago": (str, True),
    "agent_version": (str, False),
    "replicas": (int, True),
    "load": (dict, False),
    "ib_ports": (list, False),
    "gpus": (list, False),
    "nvlink_domain": (str, False),
    "imex": (str, False),
    "imex_channels": (int, False),
}
# GPUView.
GPU = {
    "index": (int, True),
    "name": (str, True),
    "numa": (int, False),  # int without omitempty in Go, but a card whose NUMA node was not read has none
    "nvlink_peers": (list, False),
    "nearest_nic": (str, False),
    "nic_path": (str, False),
    "fabric_state": (str, False),
    "domain": (str, False),
    "bandwidth": (str, False),
}
# IBPortView.
PORT = {
    "hca": (str, True),
    "port": (int, True),
    "state": (str, True),
    "phys_state": (str, False),
    "rate_gbps": (int, False),  # a whole rate; a Go int cannot decode 400.0
    "link_layer": (str, False),
    "active": (bool, True),
    "fabric": (str, False),
    "physical": (str, False),
    "sm_error": (str, False),
    "errors": (dict, False),
    "tx_bytes": (int, False),
    "rx_bytes": (int, False),
}
# LoadView: only the figures the agent sent (llmgw leaves out what it did not measure).
LOAD = {
    "cpu_percent": (NUMBER, False),
    "cpus": (int, False),
    "load1": (NUMBER, False),
    "load5": (NUMBER, False),
    "load15": (NUMBER, False),
    "memory_used_bytes": (int, False),
    "memory_total_bytes": (int, False),
    "memory_percent": (NUMBER, False),
    "age_seconds": (int, True),
}
# ModelView.
MODEL = {
    "name": (str, True),
    "description": (str, False),
    "aliases": (list, False),
    "source": (str, True),
    "min_replicas": (int, True),
    "max_replicas": (int, True),
    "ready_replicas": (int, True),
    "total_replicas": (int, True),
    "fallbacks": (list, False),
    "profiles": (list, True),
}


def check(obj: dict, shape: dict, where: str) -> None:
    for key, (kind, required) in shape.items():
        if key not in obj:
            assert not required, f"{where}: {key} is missing"
            continue
        assert isinstance(obj[key], kind) and not (kind is not bool and isinstance(obj[key], bool)), (
            f"{where}.{key} is {obj[key]!r}, not {kind}"
        )


@pytest.fixture
def fleet(db):
    ingest_fleet("gb200-nvl72:1,h100-hgx:2@north,a100-mig:1,cpu:1")
    model = add_model()
    place(model, "hgx-000", [0, 1])
    now = timezone.now()
    load = {"cpu_percent": 12.5, "cpus": 64, "load1": 3.0, "memory_used_mb": 1024, "memory_total_mb": 4096}
    Node.objects.filter(name="hgx-000").update(load=load, last_seen=now - timedelta(seconds=5))
    return model


def test_every_node_carries_the_seeds_names_and_types(operator, fleet):
    nodes = operator.get("/api/v1/nodes").json()
    assert len(nodes) >= 5
    for n in nodes:
        check(n, NODE, n["id"])
        for g in n.get("gpus", []):
            check(g, GPU, f"{n['id']}.gpus")
        for p in n.get("ib_ports", []):
            check(p, PORT, f"{n['id']}.ib_ports")
            for name, count in p.get("errors", {}).items():
                assert isinstance(name, str) and isinstance(count, int)
        if "load" in n:
            check(n["load"], LOAD, f"{n['id']}.load")
    by_id = {n["id"]: n for n in nodes}
    hgx = by_id["hgx-000"]
    assert len(hgx["gpus"]) == 8 and hgx["ib_ports"], "the cards and ports are in the listing, not only the page"
    assert hgx["load"]["memory_used_bytes"] == 1024 * 2**20 and hgx["load"]["memory_total_bytes"] == 4096 * 2**20
    assert hgx["load"]["cpus"] == 64
    tray = next(n for n in nodes if n["id"].startswith("nvl"))
    assert tray["nvlink_domain"] and tray["imex"], "a GB200 tray names its domain and IMEX state"
    assert tray["imex_channels"] == len(tray["imex_channel_ids"])
    assert {g.get("domain") for g in tray["gpus"]} == {tray["nvlink_domain"]}


def test_last_seen_ago_is_always_a_string():
    assert [go_duration(s) for s in (0, 45, 185, 3600, 93601)] == ["0s", "45s", "3m5s", "1h0m0s", "26h0m1s"]


def test_a_node_never_heard_from_has_an_empty_last_seen_ago(operator, db):
    Node.objects.create(name="bare")
    [bare] = operator.get("/api/v1/nodes").json()
    check(bare, NODE, "bare")
    assert bare["last_seen_ago"] == "" and "last_seen" not in bare


def test_the_models_listing_keeps_profiles_as_names(operator, fleet):
    [model] = operator.get("/api/v1/models").json()
    check(model, MODEL, model["name"])
    assert model["profiles"] == ["h100"] and all(isinstance(p, str) for p in model["profiles"])
    assert [p["name"] for p in model["profile_specs"]] == model["profiles"]


def listing_queries(operator) -> int:
    operator.get("/api/v1/nodes")  # warm: the token's last use is written once
    with CaptureQueriesContext(connection) as seen:
        assert operator.get("/api/v1/nodes").status_code == 200
    return len(seen)


def test_the_listing_costs_the_same_queries_for_one_node_and_for_many(operator, db):
    ingest_fleet("h100-hgx:1")
    one = listing_queries(operator)
    ingest_fleet("gb200-nvl72:1,h100-hgx:6@north,a100-mig:2,cpu:2", prefix="b-")
    assert Node.objects.count() > 20
    assert listing_queries(operator) == one


def test_fields_keeps_only_the_named_ones_and_skips_the_cards_and_ports(operator, fleet):
    full = {n["id"]: n for n in operator.get("/api/v1/nodes").json()}
    lean = operator.get("/api/v1/nodes?fields=id,state,gpu_free").json()
    assert [sorted(n) for n in lean] == [["gpu_free", "id", "state"]] * len(full)
    assert all(n["gpu_free"] == full[n["id"]]["gpu_free"] for n in lean)
    with_cards = operator.get("/api/v1/nodes?fields=id,gpus").json()
    assert all(n.get("gpus", []) == full[n["id"]].get("gpus", []) for n in with_cards)
    with CaptureQueriesContext(connection) as seen:
        operator.get("/api/v1/nodes?fields=id,state")
    assert not any("inventory_ibport" in q["sql"] for q in seen.captured_queries), "ports not asked for, not read"


@pytest.mark.parametrize(
    "asked, says",
    [("id,colour", "fields: a node has no field 'colour'"), (",", "fields: name at least one field")],
)
def test_a_wrong_fields_is_a_400_that_names_it(operator, fleet, asked, says):
    answer = operator.get(f"/api/v1/nodes?fields={asked}")
    assert answer.status_code == 400 and answer.json()["error"].startswith(says)


def test_the_listing_leaves_the_cycle_collector_as_it_found_it(operator, fleet):
    assert gc.isenabled()
    assert operator.get("/api/v1/nodes").status_code == 200
    assert gc.isenabled(), "the collector is back on once the listing is built"
    gc.disable()
    try:
        node_list(wiring=True)
        assert not gc.isenabled(), "a collector someone else turned off stays off"
    finally:
        gc.enable()
