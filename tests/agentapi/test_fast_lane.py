"""The heartbeat fast lane: the same answers as the Django view, without touching the database per beat."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from inventory.models import Node
from llmgw.agentapi.desk import desk
from llmgw.asgi import application
from llmgw.core.bootstrap import issue_join_token
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
def test_refusals_read_like_the_django_views(client, fleet, body, status, words):
    fast = asyncio.run(beats(fleet[:1], body))[0]
    content = body if isinstance(body, bytes) else json.dumps(body)
    slow = client.post(
        "/api/v1/agent/heartbeat",
        data=content,
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {fleet[0]}",
    )
    assert fast.status_code == slow.status_code == status
    assert fast.json() == slow.json() and words in fast.json()["error"]


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
