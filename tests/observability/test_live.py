"""End to end: ``llmgw serve`` with a simulated fleet speaking HTTP, scraped as Prometheus would, with the
doctor sweep running from beat in the embedded worker."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from agent.simulator import fleet as F
from agent.simulator.runner import Simulation
from tests.core.test_serve import Server
from tests.observability.fleet import Scrape

pytestmark = pytest.mark.slow


def scrape(server: Server, token: str) -> Scrape:
    answer = httpx.get(f"http://{server.admin}/metrics", headers={"Authorization": f"Bearer {token}"}, timeout=10)
    assert answer.status_code == 200, answer.text
    return Scrape(answer.text)


async def until(check, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.3)


def test_a_served_fleet_scraped_and_swept(tmp_path):
    server = Server(tmp_path, LLMGW_EVERY_DOCTOR="2")
    try:
        server.wait_ready()
        token = (server.data / "admin-token").read_text().strip()
        join = (server.data / "join-token").read_text().strip()
        assert httpx.get(f"http://{server.admin}/metrics").status_code == 401
        assert httpx.get(f"http://{server.gateway}/metrics", headers={"Authorization": f"Bearer {token}"}).status_code \
            == 404, "the gateway listener never serves the fleet's figures"  # fmt: skip
        asyncio.run(scenario(server, token, join))
    finally:
        assert server.stop() == 0, server.log.read_text()
    assert "Traceback" not in server.log.read_text(), server.log.read_text()


async def scenario(server: Server, token: str, join: str) -> None:
    nodes = F.build_fleet("gb200-nvl72:1,h100-hgx:1")
    sim = Simulation(f"http://{server.admin}", join, nodes, heartbeat_interval_s=1.0, report_interval_s=60)
    await sim.start()
    try:
        await sim.wait_registered(timeout=60)

        def joined_cards():
            s = scrape(server, token)
            values = s.by("llmgw_gpu_nvlink_joined", "node", "gpu")
            return values if len(values) == 72 else None

        before = await until(joined_cards, 30, "every card of the rack in the scrape")
        assert set(before.values()) == {1.0}

        sim.tray_leave("nvl72-00-tray-04")

        def tray_out():
            values = joined_cards()
            return values if values and values[("nvl72-00-tray-04", "0")] == 0.0 else None

        after = await until(tray_out, 30, "the tray's cards at 0")
        assert {k for k, v in after.items() if v == 0.0} == {("nvl72-00-tray-04", str(i)) for i in range(4)}

        # The sweep, run by beat in the served worker, opens its finding; the scrape counts it.
        def finding():
            s = scrape(server, token)
            return s.by("llmgw_findings_open", "kind", "severity").get(("domain_partly_joined", "warning"))

        assert await until(finding, 60, "the sweep's finding") == 1.0
        s = scrape(server, token)
        assert s.value("llmgw_gpus", **{"class": "h100-80g", "state": "free"}) == 8
        assert "django_http_requests_total_by_method" in s.families, "this process's own figures too"

        sim.tray_rejoin("nvl72-00-tray-04")
        await until(lambda: set((joined_cards() or {0: 0}).values()) == {1.0}, 30, "the tray back in the scrape")
        await until(lambda: finding() is None, 60, "the finding resolved")
    finally:
        await sim.stop()
