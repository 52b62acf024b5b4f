"""What the agent API tells the live pages: through inventory's signals, to the ``fleet`` group alone, after commit."""

from __future__ import annotations

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from agentapi.views import publish_changes
from dashboard import live
from inventory import signals
from inventory.models import Node, NVLinkDomain
from inventory.writes.heartbeats import Flusher, desk
from inventory.writes.ingest import IngestResult
from tests.agentapi.agenthttp import post, register
from tests.agentapi.reports import report
from tests.livespy import IN_MEMORY, group_sends, heard, updates_sent

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def in_memory_layer(settings):
    settings.CHANNEL_LAYERS = IN_MEMORY
    live.breaker.reset()


def test_a_changed_report_is_one_group_send_to_the_fleet_and_no_query(monkeypatch):
    node = Node.objects.create(name="tray-01")
    domain = NVLinkDomain.objects.create(cluster_uuid="rack-uuid", clique_id=1)
    # A card moving into a rack: the pages read the move from the message; no group per rack is looked up.
    result = IngestResult(node_fields=["load"], domain_moves=[(0, None, domain.key)])
    sent = group_sends(monkeypatch)
    with CaptureQueriesContext(connection) as queries:
        publish_changes(node, result)
    assert [q["sql"] for q in queries.captured_queries] == []
    assert [group for group, _ in sent] == ["fleet"]
    assert sent[0][1]["kind"] == "node.report" and sent[0][1]["data"]["domain_moves"] == [(0, None, domain.key)]


def test_a_changed_report_over_http_publishes_once_to_the_fleet(client, join, monkeypatch):
    credential = register(client, join, report=report()).json()["credential"]
    sent = group_sends(monkeypatch)
    with heard(signals.node_reported) as reported:
        answer = post(client, "report", report(hostname="renamed"), credential)
    assert answer.status_code == 200 and answer.json()["changed"]
    assert [(group, message["kind"]) for group, message in updates_sent(sent)] == [("fleet", "node.report")]
    assert [call["node"].name for call in reported] == ["tray-01"]


def test_registering_is_told_as_the_report_and_the_newcomer_to_the_fleet(client, join, monkeypatch):
    sent = group_sends(monkeypatch)
    with heard(signals.node_registered) as registered:
        assert register(client, join, report=report()).status_code == 201
    assert sorted((group, message["kind"]) for group, message in updates_sent(sent)) == [
        ("fleet", "node.registered"),
        ("fleet", "node.report"),
    ]
    assert [call["node"].name for call in registered] == ["tray-01"]


def test_a_report_rolled_back_is_never_told(monkeypatch):
    node = Node.objects.create(name="tray-01")
    sent = group_sends(monkeypatch)
    with heard(signals.node_reported) as reported, pytest.raises(RuntimeError), transaction.atomic():
        publish_changes(node, IngestResult(node_fields=["load"]))
        raise RuntimeError("the writes fail after the report was read")
    assert reported == [] and sent == []


def test_an_unchanged_report_is_not_told(monkeypatch):
    node = Node.objects.create(name="tray-01")
    with heard(signals.node_reported) as reported:
        publish_changes(node, IngestResult(unchanged=True))
    assert reported == []


def test_the_flusher_tells_of_nodes_back_in_one_go(client, join, monkeypatch):
    credentials = [register(client, join, name=f"n-{i}", machine_id=f"m-{i}").json()["credential"] for i in range(3)]
    Node.objects.update(reachable=False)
    for credential in credentials:
        desk.accept(desk.lookup(credential), {}, timezone.now())
    sent = group_sends(monkeypatch)
    with heard(signals.nodes_came_back) as back:
        Flusher(desk, 1.0).once()
    assert sorted(name for _, name in back[0]["nodes"]) == ["n-0", "n-1", "n-2"]
    assert sorted((group, m["kind"], m["subject"]) for group, m in updates_sent(sent)) == [
        ("fleet", "node.reachable", f"n-{i}") for i in range(3)
    ]
