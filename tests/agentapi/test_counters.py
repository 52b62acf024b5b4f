"""A report whose only news is an InfiniBand error counter is stored, on both lanes, so "errors rising" can fire.

Before, counters were left out of the report's digest altogether: on a stable
node every later report matched the stored digest, the short-cut dropped it,
and the counters stayed as they were at the last real change.
"""

from __future__ import annotations

import asyncio
import copy
import json

import httpx
import pytest

from inventory.fabric_inventory import analyze_inventory
from inventory.models import IBPort
from inventory.writes.heartbeats import desk
from llmgw.asgi import application
from tests.agentapi.agenthttp import post
from tests.agentapi.reports import report

pytestmark = pytest.mark.django_db(transaction=True)


def counted(**counters) -> dict:
    out = copy.deepcopy(report())
    out["ib_ports"][0]["counters"] = {"symbol_error": 0, "port_xmit_data": 100, **counters}
    return out


async def fast_report(credential: str, body: dict) -> dict:
    transport = httpx.ASGITransport(app=application)
    async with httpx.AsyncClient(transport=transport, base_url="http://control") as http:
        answer = await http.post(
            "/api/v1/agent/report",
            content=json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {credential}", "Content-Type": "application/json"},
        )
    assert answer.status_code == 200, answer.content
    return answer.json()


def rising() -> list[str]:
    return [p.message for p in analyze_inventory().problems if p.kind == "errors_rising"]


@pytest.mark.parametrize("lane", ["view", "fast"])
def test_an_error_counter_that_rises_on_a_stable_node_is_stored_and_told(client, node, lane):
    def send(body: dict) -> dict:
        return post(client, "report", body, node).json() if lane == "view" else asyncio.run(fast_report(node, body))

    send(counted())
    desk.flush()
    assert send(counted(port_xmit_data=999))["unchanged"] is True, "traffic alone is no news"
    answer = send(counted(symbol_error=7, port_xmit_data=1234))
    assert answer["unchanged"] is False
    port = IBPort.objects.get()
    assert port.counters["symbol_error"] == 7 and port.previous_counters["symbol_error"] == 0
    assert any("symbol errors +7" in message for message in rising()), rising()
