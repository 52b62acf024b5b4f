"""ctl against the real API in-process: tables for people, --json for scripts, refusals as the server's sentence."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from agent.simulator import fleet as F
from catalog.models import CapacityMeasurement
from core.models import ApiToken, AuditEntry
from inventory import reachability
from inventory.models import GPU, Node, NVLinkDomain
from placement.models import Shard
from placement.writes import load
from placement.writes.reconciler import reconcile
from tests import people
from tests.api.fleet import add_model, ingest, ingest_fleet, place
from tests.ctl.transport import DjangoTransport, run

pytestmark = pytest.mark.django_db


@pytest.fixture
def ctl(db, monkeypatch, tmp_path):
    """``llmgw ctl`` as Olivia, with her token in the environment and no config file."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    user = people.operator("olivia")
    _, secret = ApiToken.issue(user, "laptop")
    monkeypatch.setenv("LLMGW_TOKEN", secret)
    transport = DjangoTransport()
    return lambda *argv: run(list(argv), transport)


@pytest.fixture
def fleet(db):
    ingest_fleet("gb200-nvl72:1,h100-hgx:2@north,a100-mig:1")
    model = add_model()
    replica = place(model, "hgx-000", [0, 1], state="starting", shard_state="fetching")
    Shard.objects.filter(replica=replica).update(
        fetch_source="hf://m", fetch_done=4_000_000_000, fetch_total=16_000_000_000
    )
    return replica


def test_status_counts_devices_by_class(ctl, fleet):
    code, out, _ = ctl("status")
    assert code == 0
    assert "nodes 21: 21 ready" in out
    assert "a100-80g-mig-1g.20gb" in out and "gb200-185g" in out and "h100-80g" in out
    assert "1 starting (1 downloading)" in out


def test_nodes_and_one_node(ctl, fleet):
    code, out, _ = ctl("nodes")
    assert code == 0 and "14/16" not in out and "6/8 h100-80g" in out and "4/4 a100-80g-mig-1g.20gb" in out
    code, out, _ = ctl("node", "hgx-000")
    assert code == 0 and "mlx5_0 (PIX)" in out and "NVLink" in out and "llama-8b#" in out


def test_one_node_lists_what_card_health_did(ctl, fleet, monkeypatch):
    monkeypatch.setenv("LLMGW_HEALTH_CORDON_AFTER", "2")
    (sim,) = [s for s in F.build_fleet("h100-hgx:2@north") if s.name == "hgx-001"]  # the fixture's machine
    for _ in range(2):
        F.xid(sim, 2, 79)
        ingest(sim)
    code, out, _ = ctl("node", "hgx-001")
    assert code == 0
    assert "gpu 2 held" in out and "Xid 79: GPU has fallen off the bus." in out
    assert "cordoned by card health: 2 card health problems" in out
    assert "hold-card" in out and "cordon" in out
    answer = json.loads(ctl("node", "hgx-001", "--json")[1])
    assert [a["action"] for a in answer["health_actions"]] == ["cordon", "hold-card"]
    assert answer["held_gpus"][0]["gpu"] == 2 and answer["state"] == "cordoned"


def test_replicas_show_a_download_with_its_progress(ctl, fleet):
    code, out, _ = ctl("replicas")
    assert code == 0 and "25% of 16.0 GB" in out and "hgx-000:0,1" in out
    code, out, _ = ctl("replicas", "llama", "--json")
    assert json.loads(out)[0]["shards"][0]["fetch"]["percent"] == 25


def test_replicas_show_a_starts_phases_and_what_it_should_still_take(ctl, fleet):
    Shard.objects.filter(replica=fleet).update(phases={"fetch_s": 12.4})
    code, out, _ = ctl("replicas")
    said = " ".join(out.split())  # the sentence under the table wraps at the terminal's width
    assert code == 0 and "25% of 16.0 GB" in out, "while it downloads, the download"
    assert f"{fleet.id}: llama-8b: replica starting on hgx-000, fetching the weights (4.0 of 16.0 GB)" in said
    assert "the defaults" in said, "nothing measured yet, and it says so"
    Shard.objects.filter(replica=fleet).update(
        state="starting", phases={"fetch_s": 3, "load_s": 41, "weights_local": True}
    )
    out = ctl("replicas")[1]
    assert "fetch 3 s (local), load 41 s" in " ".join(out.split()) and "loading the engine" in out


def test_json_is_the_servers_answer(ctl, fleet):
    code, out, _ = ctl("--json", "nodes")
    assert code == 0 and {n["id"] for n in json.loads(out)} >= {"hgx-000", "mig-00"}
    code, out, _ = ctl("status", "--json")
    assert json.loads(out)["nodes"]["total"] == 21


def test_cordon_drain_uncordon_record_the_actor(ctl, fleet):
    assert ctl("cordon", "hgx-001")[1].strip() == "hgx-001: ready → cordoned"
    assert ctl("drain", "hgx-001", "--actor", "ana")[0] == 0
    assert Node.objects.get(name="hgx-001").state == "draining"
    assert ctl("uncordon", "hgx-001")[0] == 0
    assert list(AuditEntry.objects.filter(target="hgx-001").order_by("at").values_list("action", "actor")) == [
        ("cordon", "olivia"),
        ("drain", "ana"),
        ("uncordon", "olivia"),
    ]


def test_a_refusal_prints_the_servers_sentence_and_fails(ctl, fleet):
    code, out, err = ctl("cordon", "nope")
    assert code == 1 and out == ""
    assert err.strip() == "llmgw ctl: no node named 'nope'; `llmgw ctl nodes` lists them"
    code, _, err = ctl("scale", "llama-8b", "3", "1")
    assert code == 1 and "max" in err


def test_a_read_only_token_is_told_so(ctl, fleet, monkeypatch):
    _, secret = ApiToken.issue(people.person("rui", "viewers", "finance"), "ro", read_only=True)
    code, _, err = ctl("--token", secret, "drain", "hgx-001")
    assert code == 1 and "read-only" in err


def test_without_a_token_ctl_says_where_to_put_one(ctl, fleet, monkeypatch):
    monkeypatch.delenv("LLMGW_TOKEN")
    code, _, err = ctl("status")
    assert code == 1 and "LLMGW_TOKEN" in err


def test_scale_add_remove_and_explain(ctl, fleet, tmp_path):
    code, out, _ = ctl("scale", "llama", "0", "3", "--idle-timeout", "30m")
    assert code == 0 and out.strip() == "llama-8b: 0-3 replicas (started on demand), idle timeout 30m"
    assert ctl("scale", "llama", "1", "--idle-timeout", "never")[1].strip().endswith("idle timeout never")
    definition = tmp_path / "tiny.yaml"
    definition.write_text(
        "name: tiny\nscaling: {min: 0, max: 1}\n"
        "profiles:\n  - {name: b200, engine: vllm, gpu_class: b200-180g, gpus: 1}\n"
    )
    code, out, _ = ctl("add-model", str(definition))
    assert code == 0 and "added tiny" in out and "warning:" in out and "b200-180g" in out
    code, out, _ = ctl("explain", "tiny")
    assert code == 0 and "no replica placed" in out and "has not looked" in out
    assert ctl("remove-model", "tiny")[1].strip() == "removed tiny"
    code, _, err = ctl("add-model", str(tmp_path / "missing.yaml"))
    assert code == 1 and "could not be read" in err


def test_explain_says_a_replica_failed_to_start_in_time_and_was_placed_again(ctl, fleet):
    """The fixture's replica fetches and never becomes ready: past the floor (1800 s) the reconciler fails it."""
    reconcile(now=fleet.created_at + timedelta(seconds=1801))
    code, out, _ = ctl("explain", "llama")
    out = " ".join(out.split())
    assert code == 0, out
    assert "start timed out, " in out
    assert f"replica {fleet.id} on hgx-000 was not ready 1801 s after it was placed" in out
    assert "raised to the floor of 1800 s); failed by the control plane, so that another is placed" in out
    (told,) = json.loads(ctl("explain", "llama", "--json")[1])["start_timeouts"]
    assert told["replica"] == fleet.id and told["deadline_s"] == 1800


def test_logs_nvlink_fabrics_topology(ctl, fleet):
    Node.objects.filter(name="hgx-000").update(shard_status=[{"id": "r-0", "log_tail": ["[INFO] ready"]}])
    code, out, _ = ctl("logs", "hgx-000")
    assert code == 0 and "[INFO] ready" in out, "engine lines are printed as they are, not as markup"
    code, out, _ = ctl("nvlink")
    assert code == 0 and "18/18 nodes in" in out
    code, out, _ = ctl("--json", "fabrics")
    fabric = json.loads(out)["physical"][0]["id"]
    code, out, _ = ctl("topology", fabric)
    assert code == 0 and "No scan of this fabric has been uploaded" in out


def test_orphans_and_collect(ctl, fleet):
    Node.objects.filter(name="hgx-001").update(weights=[{"path": "/models/old", "bytes": 2_000_000_000}])
    code, out, _ = ctl("orphans")
    assert code == 0 and "/models/old" in out and "2.0 GB" in out
    code, out, _ = ctl("collect", "--node", "hgx-001")
    assert code == 0 and "requested by olivia" in out


def test_capacity(ctl, fleet, db):
    from rest_framework.test import APIClient

    client = APIClient()
    client.force_authenticate(get_user_model().objects.get(username="olivia"))
    client.put("/api/v1/models/llama-8b/capacity", {"profile": "h100", "tokens_per_second": 900}, format="json")
    code, out, _ = ctl("capacity")
    assert code == 0 and "tokens_per_second 900" in out


def test_what_if_says_what_would_stop_and_where_it_would_go(ctl, fleet):
    code, out, err = ctl("what-if", "lose", "hgx-000")
    assert code == 0, err
    assert "what if we lose hgx-000 (node, 1 node)" in out
    assert f"llama-8b#{fleet.id}" in out and "hgx-001:0" in out and "one node" in out
    assert "moves 1 at 20 a minute: within 1 min" in out
    assert "Losing 1 node would stop 1 replica" in out


def test_what_if_names_the_short_models_and_the_schedulers_reasons(ctl, fleet):
    code, out, _ = ctl("what-if", "lose", "hgx-000", "hgx-001")
    assert code == 0
    assert "short: llama-8b: 0 of 1 replicas" in out and "h100: " in out and "has nowhere to put it" in out


def test_what_if_json_and_an_unknown_target(ctl, fleet):
    code, out, _ = ctl("what-if", "lose", "hgx-000,hgx-001", "--json")
    assert code == 0 and json.loads(out)["lost_nodes"] == ["hgx-000", "hgx-001"]
    code, out, err = ctl("what-if", "lose", "rack-9")
    assert code == 1 and out == "" and "'rack-9' is not a node" in err


def test_what_if_shows_a_rack_replica_falling_back_to_infiniband(ctl, db, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # the table's rows on one line each
    ingest_fleet("gb200-nvl72:1@north,h100-hgx:2@north")
    gb200 = GPU.objects.filter(node__name__contains="tray").values_list("gpu_class", flat=True).first()
    nvl = {"name": "nvl", "engine": "vllm", "gpu_class": gb200, "gpus": 4, "nodes": 2, "tp": 8}
    ib = {"name": "ib", "engine": "vllm", "gpu_class": "h100-80g", "gpus": 8, "nodes": 2, "tp": 16}
    add_model({"name": "big", "scaling": {"min": 1, "max": 1}, "profiles": [nvl, ib]})
    reconcile()
    code, out, _ = ctl("what-if", "lose", NVLinkDomain.objects.get().key)
    assert code == 0 and "(NVLink domain, 18 nodes)" in out
    assert "hgx-000:0-7, hgx-001:0-7 (as ib)" in out and "InfiniBand sm:" in out


def test_models_and_explain_show_the_autoscalers_count_and_reason(ctl, fleet, settings):
    """A load in the database (Redis not configured) scales llama up; ctl says how many and why, in numbers."""
    settings.LLMGW_REDIS_URL = None
    assert ctl("scale", "llama", "1", "3")[0] == 0
    CapacityMeasurement.objects.create(model_name="llama-8b", profile_name="h100", measurement={"max_concurrency": 16})
    now = timezone.now()
    for at in (now, now + timedelta(seconds=15)):
        load.store("gw-1", {"llama-8b": {"in_flight": 30, "waiting": 0, "tokens_per_s": 12.0, "ttft_ms": 80.0}}, at)
        reconcile(now=at)
    code, out, _ = ctl("models")
    out = " ".join(out.split())  # the console wraps long lines
    assert code == 0, out
    assert "llama-8b: in flight 30, 12 tokens/s on 1 replica, capacity 16 each at 80 % → 3; up from 1" in out
    code, out, _ = ctl("explain", "llama")
    out = " ".join(out.split())
    assert code == 0 and "autoscale: 3 wanted (up)" in out
    assert "load from database (1 gateway workers): in flight 30, waiting 0, 12 tokens/s, first token 80 ms" in out
    assert ": 1 → 3 (up): in flight 30" in out
    listed = json.loads(ctl("models", "--json")[1])
    (llama,) = [m for m in listed if m["name"] == "llama-8b"]
    assert llama["desired_replicas"] == 3 and llama["autoscale"]["load"]["in_flight"] == 30
    assert llama["min_replicas"] == 1 and llama["max_replicas"] == 3, "the existing fields are as they were"


def test_status_shows_a_partition_and_resume_moves_ends_it(ctl, db):
    ingest_fleet("h100-hgx:3")
    now = timezone.now()
    Node.objects.update(last_seen=now - timedelta(seconds=60))
    reachability.sweep(now)
    code, out, _ = ctl("status")
    assert code == 0 and "partition: the fleet: 3 of 3 nodes silent since" in " ".join(out.split())
    code, out, _ = ctl("resume-moves", "--actor", "ana")
    assert code == 0 and "resumed moves in the fleet: its 3 silent nodes" in " ".join(out.split())
    assert AuditEntry.objects.get(action="resume-moves").actor == "ana"
    code, out, _ = ctl("resume-moves")
    assert code == 0 and "no partition was open" in out
    assert "partition:" not in ctl("status")[1]


def test_status_shows_when_a_racks_partition_turns_into_losses(ctl, db):
    names = sorted(s.name for s in ingest_fleet("h100-hgx:5"))
    Node.objects.filter(name__in=names[:2]).update(labels={"rack": "r1"})
    now = timezone.now()
    Node.objects.filter(name__in=names[:2]).update(last_seen=now - timedelta(seconds=60))
    assert reachability.sweep(now).partitions == ["rack=r1"]
    code, out, _ = ctl("status")
    words = " ".join(out.split())
    assert code == 0 and "partition: rack=r1: 2 of 2 nodes silent since" in words
    (p,) = json.loads(ctl("status", "--json")[1])["partitions"]
    assert p["until"] and f"at {p['until']} those still silent are lost" in words
