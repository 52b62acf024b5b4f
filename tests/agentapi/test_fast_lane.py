"""The heartbeat fast lane, the heartbeat's one path: answers and refusals without touching the database per beat."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from agentapi.limits import REVOKED, SEND_BEARER, USE_POST
from core import dbpool
from inventory.models import Node
from inventory.writes.heartbeats import desk
from llmgw.asgi import application
from llmgw.bootstrap import issue_join_token
from tests.agentapi.agenthttp import HEARTBEAT, asgi
from tests.agentapi.reports import report

pytestmark = pytest.mark.django_db(transaction=True)


def register(client, join, name: str) -> str:
    answer = client.post(
        "/api/v1/agent/register",
        data=json.dumps({"name": name, "machine_id": name, "report": report(hostname=name)}),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {join}",
    )
    assert answer.status_code == 201
    return answer.json()["credential"]


async def beats(credentials: list[str], body: dict | bytes) -> list[httpx.Response]:
    transport = httpx.ASGITransport(app=application)
    async with httpx.AsyncClient(transport=transport, base_url="http://control") as http:
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        return [
            await http.post(
                "/api/v1/agent/heartbeat",
                content=content,
                headers={"Authorization": f"Bearer {c}", "Content-Type": "application/json"},
            )
            for c in credentials
        ]


@pytest.fixture
def fleet(client):
    desk.pending.clear()
    join = issue_join_token()
    return [register(client, join, f"node-{i:02d}") for i in range(20)]


def test_beats_are_queued_then_written_in_a_few_statements(fleet):
    answers = asyncio.run(beats(fleet, {"load": {"cpu_percent": 12.5}}))
    assert [a.status_code for a in answers] == [200] * 20
    assert answers[0].json() == {"shards": [], "send_report": False}
    assert not Node.objects.filter(load={"cpu_percent": 12.5}).exists(), "queued, not yet written"
    with CaptureQueriesContext(connection) as queries:
        result = desk.flush()
    assert result.written == 20
    assert len(queries) <= 4, [q["sql"][:80] for q in queries]
    assert Node.objects.filter(load={"cpu_percent": 12.5}).count() == 20


def test_a_warm_desk_answers_without_any_query(fleet):
    asyncio.run(beats(fleet, {}))
    desk.flush()
    with CaptureQueriesContext(connection) as queries:
        asyncio.run(beats(fleet, {}))
    assert len(queries) == 0


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        (b"{nope", 400, "not valid JSON"),
        ({"shards": "running"}, 400, "heartbeat.shards"),
        (b"x" * (256 * 1024 + 1), 413, "at most"),
    ],
)
def test_refusals_are_a_status_and_a_sentence(fleet, body, status, words):
    answer = asyncio.run(beats(fleet[:1], body))[0]
    assert answer.status_code == status and words in answer.json()["error"]
    assert not desk.pending, "a refused beat is not queued"


@pytest.mark.parametrize(
    ("token", "status", "error"),
    [("", 401, SEND_BEARER), ("llmgw_node_forged", 401, REVOKED)],
)
def test_a_beat_without_a_known_credential_is_refused(fleet, token, status, error):
    answer = asyncio.run(beats([token], {}))[0]
    assert (answer.status_code, answer.json()) == (status, {"error": error})


def test_only_post_is_taken_on_the_heartbeat_path(fleet):
    answer = asgi(HEARTBEAT, fleet[0], method="GET")
    assert (answer.status_code, answer.headers["allow"]) == (405, "POST")
    assert answer.json() == {"error": USE_POST}


def test_a_revoked_credential_stops_within_a_flush(client, fleet):
    asyncio.run(beats(fleet[:1], {}))
    desk.flush()
    Node.objects.filter(name="node-00").update(credential_digest="rotated-elsewhere")
    asyncio.run(beats(fleet[:1], {}))
    assert desk.flush().revoked == 1
    answer = asyncio.run(beats(fleet[:1], {}))[0]
    assert answer.status_code == 401 and "register again" in answer.json()["error"]


def test_a_node_that_was_unreachable_comes_back_at_the_flush(fleet):
    Node.objects.update(reachable=False, lost=True)
    asyncio.run(beats(fleet[:3], {}))
    result = desk.flush()
    assert sorted(name for _, name in result.came_back) == ["node-00", "node-01", "node-02"]
    assert Node.objects.filter(reachable=True, lost=False).count() == 3


async def reports(credentials: list[str], bodies: list[dict]) -> list[httpx.Response]:
    transport = httpx.ASGITransport(app=application)
    async with httpx.AsyncClient(transport=transport, base_url="http://control") as http:
        return [
            await http.post("/api/v1/agent/report", json=body, headers={"Authorization": f"Bearer {c}"})
            for c, body in zip(credentials, bodies, strict=True)
        ]


def test_an_unchanged_report_is_answered_without_the_database(fleet):
    from django.utils import timezone

    bodies = [report(hostname=f"node-{i:02d}") for i in range(len(fleet))]
    for body in bodies:
        body["load"] = {"cpu_percent": 99.0}  # a reading, not a change
    desk.refresh_shards()
    before = timezone.now()
    with CaptureQueriesContext(connection) as queries:
        answers = asyncio.run(reports(fleet, bodies))
    assert len(queries) == 0
    assert all(a.status_code == 200 and a.json()["unchanged"] is True for a in answers)
    desk.flush()

    assert Node.objects.filter(load={"cpu_percent": 99.0}, last_report_at__gte=before).count() == 20


def test_a_process_that_does_not_know_the_node_looks_it_up_and_takes_its_unchanged_report(fleet, monkeypatch):
    """One of several admin processes meets a node another registered: its unchanged report is still taken here.

    Before, a credential this process had not cached sent the report to the
    view, which took it in full (a tenth of a registration's work) once per
    node and process: with two admin processes, half the fleet's reports in
    the first minute (bench/scale.py --admin-workers 2).
    """
    from inventory.writes import ingest

    taken_by_view = []
    real = ingest.ingest_report
    monkeypatch.setattr(ingest, "ingest_report", lambda *a, **k: taken_by_view.append(a) or real(*a, **k))
    bodies = [report(hostname=f"node-{i:02d}") for i in range(len(fleet))]
    desk.refresh_shards()
    desk.nodes.clear()
    desk.digests.clear()  # this process never registered the fleet
    # As in an admin process, which pools: each lookup's thread hands its connection back at once.
    monkeypatch.setattr(dbpool, "pooled", lambda: True)
    answers = asyncio.run(reports(fleet, bodies))
    assert all(a.status_code == 200 and a.json()["unchanged"] is True for a in answers), [a.text for a in answers]
    assert taken_by_view == []
    assert len(desk.nodes) == len(fleet), "known from now on"


def test_an_unknown_credential_s_report_is_the_view_s_to_refuse(fleet, monkeypatch):
    monkeypatch.setattr(dbpool, "pooled", lambda: True)  # the lookup's thread hands its connection back
    for token, status, error in (("not-a-credential", 401, REVOKED), ("", 401, SEND_BEARER)):
        answer = asgi("/api/v1/agent/report", token, report(hostname="node-00"))
        assert (answer.status_code, answer.json()) == (status, {"error": error})


def test_a_changed_report_goes_on_to_the_view_and_is_stored(fleet):
    from inventory.models import GPU

    changed = report(hostname="node-00", gpus=[])
    answer = asyncio.run(reports(fleet[:1], [changed]))[0]
    assert answer.status_code == 200 and answer.json()["unchanged"] is False
    assert not GPU.objects.filter(node__name="node-00").exists()
    bad = asyncio.run(reports(fleet[:1], [{"gpus": "many"}]))[0]
    assert bad.status_code == 400 and "report.gpus" in bad.json()["error"]


def test_a_scan_assigned_to_a_node_is_handed_out_once(fleet):
    from django.utils import timezone

    from inventory.models import FabricScan

    node = Node.objects.get(name="node-00")
    FabricScan.objects.create(fabric_key="sm:0x1", node=node, hca="mlx5_0", port=1, assigned_at=timezone.now())
    desk.refresh_shards()
    first = asyncio.run(reports(fleet[:1], [report(hostname="node-00")]))[0].json()
    assert first["scan"] == {"fabric": "sm:0x1", "hca": "mlx5_0", "port": 1}
    again = asyncio.run(reports(fleet[:1], [report(hostname="node-00")]))[0].json()
    assert "scan" not in again
    desk.flush()
    assert FabricScan.objects.get().pending_since is not None
