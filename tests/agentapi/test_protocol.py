"""The agent protocol end to end: register and report through Django, heartbeats through the fast lane, every refusal.

Each refusal is checked to leave the stored inventory exactly as it was.
"""

from __future__ import annotations

import pytest
from django.utils import timezone

from catalog.models import WeightCollection
from inventory.models import GPU, IBPort, JoinToken, Node, NVLinkDomain, SubnetManagerChange
from tests.agentapi.agenthttp import HEARTBEAT, asgi, flush, heartbeat, post, register, snapshot
from tests.agentapi.reports import CLUSTER, gpu, report

pytestmark = pytest.mark.django_db(transaction=True)


def test_registration_gives_a_credential_and_stores_the_report(client, node):
    stored = Node.objects.get(name="tray-01")
    assert stored.hostname == "tray-01.rack-a" and stored.memory_mb == 884000
    assert stored.engines == {"vllm": "0.11.0"} and stored.imex_state == "up"
    assert GPU.objects.filter(node=stored).count() == 4
    domain = NVLinkDomain.objects.get()
    assert domain.key == f"{CLUSTER}/32766"
    assert set(GPU.objects.filter(domain=domain).values_list("index", flat=True)) == {0, 1, 2, 3}
    assert IBPort.objects.get(node=stored).sm_guid == "0x248a0703005c3440"
    assert node.startswith("llmgw_node_") and stored.credential_digest and node not in stored.credential_digest


def test_the_same_machine_keeps_its_identity(client, join, node):
    again = register(client, join)
    assert again.status_code == 200
    assert Node.objects.count() == 1
    fresh = again.json()["credential"]
    assert heartbeat(fresh, {}).status_code == 200
    assert heartbeat(node, {}).status_code == 401, "the old credential is revoked"


def test_another_machine_cannot_take_a_registered_name(client, join, node):
    before = snapshot()
    answer = register(client, join, machine_id="someone-else")
    assert answer.status_code == 409 and "different machine" in answer.json()["error"]
    assert snapshot() == before


@pytest.mark.parametrize(
    ("token", "words"),
    [("nope", "unknown"), ("", "Authorization: Bearer")],
)
def test_unknown_join_tokens_are_refused(client, token, words):
    answer = post(client, "register", {"name": "x"}, token)
    assert answer.status_code == 401 and words in answer.json()["error"]
    assert not Node.objects.exists()


def test_a_revoked_join_token_is_refused_but_registered_nodes_go_on(client, join, node):
    JoinToken.objects.update(revoked_at=timezone.now())
    answer = register(client, join, name="tray-02", machine_id="m-2")
    assert answer.status_code == 401 and "revoked" in answer.json()["error"]
    assert heartbeat(node, {}).status_code == 200


def test_a_report_writes_only_what_changed(client, node, django_assert_max_num_queries):
    same = post(client, "report", report(), node)
    assert same.json()["unchanged"] is True
    # The temperature is a reading, not a change of what the machine is.
    warmer = report()
    warmer["gpus"][0]["temperature_c"] = 90
    assert post(client, "report", warmer, node).json()["unchanged"] is True

    moved = report(gpus=[gpu(0), gpu(1), gpu(2, joined=False), gpu(3)])
    answer = post(client, "report", moved, node).json()
    assert answer["unchanged"] is False and answer["changed"] is True
    card = GPU.objects.get(index=2)
    assert card.domain is None and card.fabric_state == "In Progress"
    assert NVLinkDomain.objects.count() == 1, "a domain is kept when a card leaves it"


def test_an_older_agent_leaves_fields_unknown_not_empty(client, node):
    older = report()
    del older["engines"]
    del older["imex"]
    assert post(client, "report", older, node).status_code == 200
    stored = Node.objects.get()
    assert stored.engines is None, "unknown, not 'no engines'"
    assert stored.imex_channels is None and stored.imex_state == ""


def test_sm_changes_are_kept_as_history(client, node):
    changed = report()
    changed["ib_ports"][0]["sm_guid"] = "0x248a0703005c9999"
    post(client, "report", changed, node)
    change = SubnetManagerChange.objects.get()
    assert (change.old_sm_guid, change.new_sm_guid) == ("0x248a0703005c3440", "0x248a0703005c9999")


def test_a_credential_writes_only_its_own_node(client, join, node):
    other = register(client, join, name="tray-02", machine_id="m-2", report=report(hostname="tray-02"))
    assert other.status_code == 201
    post(client, "report", report(hostname="pretending-to-be-tray-02", gpus=[gpu(0)]), node)
    assert Node.objects.get(name="tray-02").hostname == "tray-02"
    assert GPU.objects.filter(node__name="tray-02").count() == 4
    assert GPU.objects.filter(node__name="tray-01").count() == 1


@pytest.mark.parametrize(
    ("path", "body", "raw", "status", "words"),
    [
        ("report", None, b"{not json", 400, "not valid JSON"),
        ("report", None, b"x" * (2 * 1024 * 1024 + 1), 413, "at most"),
        ("heartbeat", None, b"x" * (256 * 1024 + 1), 413, "at most"),
        ("report", [1, 2], None, 400, "must be a JSON object"),
        ("report", {"gpus": [{"index": -1, "uuid": "u", "name": "n", "class": "c"}]}, None, 400, "gpus[0].index"),
        ("report", {"gpus": [{"index": 0}]}, None, 400, "gpus[0] has no uuid"),
        ("report", {"gpus": "all of them"}, None, 400, "report.gpus must be a list"),
        ("report", {"gpus": [gpu(0), gpu(0)]}, None, 400, "appears twice"),
        ("report", {"gpus": [{**gpu(0), "index": 1001}]}, None, 400, "MIG instance"),
        ("report", {"engines": ["vllm"]}, None, 400, "report.engines"),
        ("report", {"host": {"memory_mb": -5}}, None, 400, "memory_mb"),
        ("heartbeat", {"shards": "running"}, None, 400, "heartbeat.shards"),
        ("heartbeat", "beat", None, 400, "must be a JSON object"),
    ],
)
def test_bad_bodies_are_refused_and_nothing_changes(client, node, path, body, raw, status, words):
    before = snapshot()
    answer = heartbeat(node, body, raw=raw) if path == "heartbeat" else post(client, path, body, node, raw=raw)
    assert answer.status_code == status, answer.content
    assert words in answer.json()["error"]
    assert snapshot() == before


def test_wrong_credentials_are_refused_with_a_sentence(client, node):
    before = snapshot()
    for answer in (post(client, "report", report(), "llmgw_node_forged"), heartbeat("llmgw_node_forged", report())):
        assert answer.status_code == 401 and "register again" in answer.json()["error"]
    not_posted = asgi(HEARTBEAT, node, method="GET")
    assert not_posted.status_code == 405 and not_posted.headers["allow"] == "POST"
    assert snapshot() == before


def test_a_heartbeat_is_queued_and_written_by_the_flush(client, node):
    answer = asgi(HEARTBEAT, node, {"load": {"cpu_percent": 50.0}, "shards": []})
    assert answer.status_code == 200
    assert answer.json() == {"shards": [], "send_report": False}
    assert Node.objects.get().load != {"cpu_percent": 50.0}, "queued, not yet written"
    flush()
    assert Node.objects.get().load == {"cpu_percent": 50.0}


def test_a_heartbeat_asks_for_a_report_when_the_server_holds_another(client, node):
    assert heartbeat(node, {"report_digest": "something-else"}).json()["send_report"] is True


def test_weights_to_collect_ride_on_the_heartbeat_and_come_back_done(client, node):
    WeightCollection.objects.create(node="tray-01", path="/models/old", requested_by="olive")
    answer = heartbeat(node, {}).json()
    assert answer["collect"] == ["/models/old"]
    heartbeat(node, {"collected": [{"path": "/models/old"}]})
    done = WeightCollection.objects.get()
    assert done.done_at is not None and done.error == ""
    assert "collect" not in heartbeat(node, {}).json(), "the next answer no longer asks for it"
    assert heartbeat(node, {"collected": "all"}).status_code == 400
