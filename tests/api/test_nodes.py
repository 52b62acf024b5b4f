"""Nodes: the list, one node, cordon/uncordon/drain with the audit log, and engine logs."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.utils import timezone

from agent.simulator import fleet as F
from core.models import AuditEntry
from inventory import signals
from inventory.models import IBPort, Node
from tests import people
from tests.api.fleet import add_model, ingest, ingest_fleet, place

pytestmark = pytest.mark.django_db


@pytest.fixture
def fleet(db):
    sims = {s.name: s for s in ingest_fleet("h100-hgx:2@north,a100-mig:1,cpu:1")}
    model = add_model()
    place(model, "hgx-000", [0, 1])
    return sims


def by_id(answer) -> dict[str, dict]:
    return {n["id"]: n for n in answer.json()}


def test_the_list_counts_devices_by_class_and_what_shards_hold(operator, fleet):
    nodes = by_id(operator.get("/api/v1/nodes"))
    assert sorted(nodes) == ["cpu-00", "hgx-000", "hgx-001", "mig-00"]
    hgx = nodes["hgx-000"]
    assert (hgx["gpu_total"], hgx["gpu_free"], hgx["replicas"]) == (8, 6, 1)
    assert hgx["devices"] == [{"class": "h100-80g", "total": 8, "used": 2, "free": 6, "unhealthy": 0, "held": 0}]
    assert hgx["fabrics"] == ["north"] and hgx["engines"] == ["sglang", "vllm"]
    # MIG instances are devices of their own class.
    mig = nodes["mig-00"]
    assert mig["gpu_classes"] == ["a100-80g-mig-1g.20gb"] and mig["gpu_total"] == 4 and mig["gpu_free"] == 4
    cpu = nodes["cpu-00"]
    assert cpu["gpu_total"] == 0 and "fabrics" not in cpu, "no fabric declared: absent, not empty"


def test_a_mig_instance_without_its_uuid_is_held_back_with_why(operator, fleet):
    sim = fleet["mig-00"]
    for gpu in sim.gpus:
        gpu.pop("mig_uuid", None)  # what `nvidia-smi -q -x` alone gives: no MIG UUIDs
    ingest(sim)
    mig = by_id(operator.get("/api/v1/nodes"))["mig-00"]
    assert mig["gpu_total"] == 4 and mig["gpu_free"] == 0
    assert mig["unhealthy_gpus"][0] == "gpu 0/mig0: a MIG instance without its MIG UUID"


def test_an_unhealthy_card_is_neither_used_nor_free(operator, fleet):
    sim = fleet["hgx-000"]
    F.gpu_lost(sim, 1)
    ingest(sim)
    hgx = by_id(operator.get("/api/v1/nodes"))["hgx-000"]
    assert hgx["devices"][0] == {"class": "h100-80g", "total": 8, "used": 1, "free": 6, "unhealthy": 1, "held": 0}
    assert hgx["unhealthy_gpus"] == ["gpu 1: lost by the driver (GPU is lost); reboot the node"]


def test_unknown_facts_are_absent_not_empty(operator, db):
    Node.objects.create(name="bare")
    bare = by_id(operator.get("/api/v1/nodes"))["bare"]
    for key in ("engines", "models_on_disk", "memory_gb", "load", "last_seen", "disk_free_gb", "nvlink_domain"):
        assert key not in bare, key


def test_load_is_shown_only_while_fresh(operator, fleet):
    now = timezone.now()
    load = {"cpu_percent": 12.5, "load1": 3.0, "memory_used_mb": 1024, "memory_total_mb": 4096}
    Node.objects.filter(name="hgx-000").update(load=load, last_seen=now - timedelta(seconds=5))
    Node.objects.filter(name="hgx-001").update(load=load, last_seen=now - timedelta(minutes=5))
    nodes = by_id(operator.get("/api/v1/nodes"))
    fresh = nodes["hgx-000"]["load"]
    assert fresh["cpu_percent"] == 12.5 and fresh["memory_percent"] == 25.0 and 4 <= fresh["age_seconds"] <= 7
    assert "load" not in nodes["hgx-001"], "five minutes old is unknown, not idle"
    assert nodes["hgx-001"]["last_seen_seconds"] >= 299


def test_one_node_shows_its_cards_wiring_ports_and_shards(operator, fleet):
    IBPort.objects.filter(node__name="hgx-000", hca="mlx5_0").update(
        counters={"symbol_error": 7, "link_downed": 0, "port_xmit_data": 1000},
        previous_counters={"symbol_error": 2, "link_downed": 0},
    )
    node = operator.get("/api/v1/nodes/hgx-000").json()
    gpu0 = node["gpus"][0]
    assert gpu0["nvlink_peers"] == [1, 2, 3, 4, 5, 6, 7] and gpu0["numa"] == 0
    assert (gpu0["nearest_nic"], gpu0["nic_path"]) == ("mlx5_0", "PIX")
    assert gpu0["held_by"].startswith("llama-8b#") and "held_by" not in node["gpus"][2]
    port = next(p for p in node["ib_ports"] if p["hca"] == "mlx5_0")
    assert port["active"] and port["fabric"] == "north" and port["physical"].startswith("SM 0x")
    assert port["physical_id"].startswith("sm-0x")
    assert port["errors"] == {"symbol_error": 7} and port["errors_rising"] == {"symbol_error": 5}
    assert port["tx_bytes"] == 1000
    assert [s["model"] for s in node["shards"]] == ["llama-8b"] and node["shards"][0]["gpus"] == ["0", "1"]


def test_an_unknown_node_is_a_404_that_says_where_to_look(operator, fleet):
    answer = operator.get("/api/v1/nodes/nope")
    assert answer.status_code == 404 and "ctl nodes" in answer.json()["error"]


# --- cordon, uncordon, drain ---


@pytest.fixture
def hook():
    """Who hears inventory's node_state_changed besides placement: a recorder of the names sent."""
    calls = []

    def record(sender, *, name, **kwargs):
        calls.append(name)

    signals.node_state_changed.connect(record)
    yield calls
    signals.node_state_changed.disconnect(record)


@pytest.mark.parametrize(
    ("word", "state", "action"), [("cordon", "cordoned", "cordon"), ("drain", "draining", "drain")]
)
def test_cordon_and_drain_are_stored_audited_and_signalled(operator, fleet, hook, word, state, action):
    answer = operator.post("/api/v1/nodes/hgx-001/state", {"state": word}, format="json")
    assert answer.status_code == 200
    assert answer.json() == {"id": "hgx-001", "state": state, "previous": "ready"}
    assert Node.objects.get(name="hgx-001").state == state
    entry = AuditEntry.objects.get(action=action)
    assert (entry.actor, entry.target, entry.detail["state"]) == ("olivia", "hgx-001", state)
    assert hook == ["hgx-001"]


def test_the_actor_header_names_who_did_it(operator, fleet, hook):
    Node.objects.filter(name="hgx-001").update(state="cordoned")
    operator.post("/api/v1/nodes/hgx-001/state", {"state": "uncordon"}, format="json", HTTP_X_LLMGW_ACTOR="ana")
    entry = AuditEntry.objects.get(action="uncordon")
    assert entry.actor == "ana" and entry.detail["user"] == "olivia" and entry.detail["previous"] == "cordoned"
    assert Node.objects.get(name="hgx-001").state == "ready"


def test_a_failing_receiver_never_fails_the_change(operator, fleet):
    def broken(sender, **kwargs):
        raise RuntimeError("the broker is down")

    signals.node_state_changed.connect(broken)
    try:
        answer = operator.post("/api/v1/nodes/hgx-001/state", {"state": "drain"}, format="json")
    finally:
        signals.node_state_changed.disconnect(broken)
    answer = operator.post("/api/v1/nodes/hgx-001/state", {"state": "drain"}, format="json")
    assert answer.status_code == 200 and Node.objects.get(name="hgx-001").state == "draining"


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"state": "reboot"}, "cordon, uncordon or drain"),
        ({}, "cordon, uncordon or drain"),
        ({"state": 3}, "cordon, uncordon or drain"),
        ([1, 2], "must be a JSON object"),
    ],
)
def test_a_wrong_state_is_a_400_that_lists_the_right_ones(operator, fleet, body, says):
    answer = operator.post("/api/v1/nodes/hgx-001/state", body, format="json")
    assert answer.status_code == 400 and says in answer.json()["error"]
    assert (
        Node.objects.get(name="hgx-001").state == "ready"
        and not AuditEntry.objects.exclude(action="add-model").exists()
    )


def test_bodies_that_are_not_json_or_too_large_are_refused(operator, fleet):
    path = "/api/v1/nodes/hgx-001/state"
    bad = operator.generic("POST", path, b"{state: cordon", content_type="application/json")
    assert bad.status_code == 400 and "not valid JSON" in bad.json()["error"]
    huge = operator.generic(
        "POST", path, b'{"state": "' + b"x" * (1024 * 1024) + b'"}', content_type="application/json"
    )
    assert huge.status_code == 413 and "1 MiB" in huge.json()["error"]
    nul = operator.post(path, {"state": "cordon\x00"}, format="json")
    assert nul.status_code == 400 and "NUL" in nul.json()["error"]
    deep = operator.generic("POST", path, b"[" * 100_000 + b"]" * 100_000, content_type="application/json")
    assert deep.status_code == 400
    form = operator.post(path, {"state": "cordon"})
    assert form.status_code == 415
    assert Node.objects.get(name="hgx-001").state == "ready"


def test_cordoning_an_unknown_node_is_a_404(operator, fleet):
    answer = operator.post("/api/v1/nodes/nope/state", {"state": "cordon"}, format="json")
    assert answer.status_code == 404 and not AuditEntry.objects.exclude(action="add-model").exists()


# --- logs ---


def test_logs_serve_what_the_agent_sent_per_shard(operator, fleet):
    Node.objects.filter(name="hgx-000").update(
        shard_status=[
            {"id": "r1-0", "replica": "r1", "rank": 0, "state": "ready", "log_tail": ["loading", "ready"]},
            {"id": "r2-0", "replica": "r2", "rank": 0, "state": "starting"},
        ],
        last_seen=timezone.now(),
    )
    every = operator.get("/api/v1/nodes/hgx-000/logs").json()
    assert [s["id"] for s in every["shards"]] == ["r1-0", "r2-0"]
    assert every["shards"][0]["lines"] == ["loading", "ready"] and "lines" not in every["shards"][1]
    one = operator.get("/api/v1/nodes/hgx-000/logs?shard=r1").json()
    assert [s["id"] for s in one["shards"]] == ["r1-0"]
    missing = operator.get("/api/v1/nodes/hgx-000/logs?shard=zz")
    assert missing.status_code == 404 and "no shard 'zz'" in missing.json()["error"]
    assert operator.get("/api/v1/nodes/nope/logs").status_code == 404


def test_the_list_is_streamed_under_asgi_a_page_at_a_time_with_the_same_answer(operator, fleet, monkeypatch):
    """Under ASGI (every server llmgw runs) the listing goes out page by page; joined, it is the answer WSGI gives."""
    from asgiref.sync import async_to_sync
    from django.test import AsyncClient

    from core.models import ApiToken
    from inventory.reads import nodes as reads

    ingest_fleet("h100-hgx:3@south", prefix="more-")
    whole = operator.get("/api/v1/nodes").json()
    monkeypatch.setattr(reads, "NODE_PAGE", 2)
    _, secret = ApiToken.issue(people.operator("asgi"), "asgi")

    async def listing() -> tuple[bool, list[bytes]]:
        answer = await AsyncClient().get("/api/v1/nodes", headers={"Authorization": f"Bearer {secret}"})
        return answer.streaming, [chunk async for chunk in answer.streaming_content]

    streaming, chunks = async_to_sync(listing)()
    assert streaming and len(chunks) == 2 + 4, "the brackets, then one chunk for each page of two of the 7 nodes"
    assert json.loads(b"".join(chunks)) == whole
    assert [n["id"] for n in whole] == sorted(n["id"] for n in whole) and len(whole) == 7


def test_each_page_of_the_list_takes_the_same_queries(operator, fleet, django_assert_num_queries):
    """Paged, the listing reads the same few queries a page (its nodes, cards, problems, ports), whatever the page."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from placement.reads import node_pages

    ingest_fleet("h100-hgx:4@south", prefix="more-")
    counts = []
    with CaptureQueriesContext(connection) as seen:
        pages = node_pages(wiring=True, size=3)
        for page in pages:
            counts.append((len(page), len(seen)))
    sizes, totals = zip(*counts, strict=True)
    assert sizes == (3, 3, 2)
    assert totals[2] - totals[1] == totals[1] - totals[0] == 4
    with django_assert_num_queries(totals[0]):  # the first page only: the rest are read when asked for
        next(node_pages(wiring=True, size=3))
