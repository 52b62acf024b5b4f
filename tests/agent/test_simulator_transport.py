"""A simulated fleet's shared client hands its pool no more requests than it has connections.

Thousands of agents registering at once through one httpx client queued
thousands of requests in httpcore's pool, which walks them all against every
connection each time one frees: ``bench/ingest.py --nodes 2000`` spun for
over ten minutes of its own CPU, the control plane idle. The transport here
holds the rest back (``agent.simulator.bounded``).
"""

from __future__ import annotations

import asyncio

import httpx
import pytest

from agent.simulator import fleet as F
from agent.simulator.bounded import BoundedTransport
from agent.simulator.runner import Simulation


class Counting(httpx.AsyncBaseTransport):
    """Answers each request after a moment, counting how many are in it at once; fails the ones asked to."""

    def __init__(self) -> None:
        self.inside = self.most = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.inside += 1
        self.most = max(self.most, self.inside)
        try:
            await asyncio.sleep(0.002)
            if request.url.path == "/fail":
                raise httpx.ConnectError("refused")
        finally:
            self.inside -= 1
        return httpx.Response(200, stream=Body(self), request=request)


class Body(httpx.AsyncByteStream):
    """A body whose connection counts as busy until it is closed, as a pooled connection's does."""

    def __init__(self, inner: Counting) -> None:
        self.inner = inner
        inner.inside += 1
        inner.most = max(inner.most, inner.inside)
        self.open = True

    async def __aiter__(self):
        await asyncio.sleep(0.001)  # the body arrives a moment after the headers, as over a socket
        yield b"{}"

    async def aclose(self) -> None:
        if self.open:
            self.open = False
            self.inner.inside -= 1


async def _send_all(paths: list[str], limit: int) -> tuple[Counting, list]:
    inner = Counting()
    async with httpx.AsyncClient(transport=BoundedTransport(inner, limit)) as client:
        answers = await asyncio.wait_for(
            asyncio.gather(*(client.get(f"http://sim{p}") for p in paths), return_exceptions=True), timeout=20
        )
    return inner, answers


def test_no_more_requests_reach_the_pool_than_it_has_room_for():
    inner, answers = asyncio.run(_send_all(["/ok"] * 60, limit=4))
    assert all(isinstance(a, httpx.Response) and a.status_code == 200 for a in answers)
    assert inner.most == 4 and inner.inside == 0


def test_a_failed_request_gives_its_room_back():
    """Twelve failures through two slots, then every later request still goes through (none waits forever)."""
    inner, answers = asyncio.run(_send_all(["/fail"] * 12 + ["/ok"] * 12, limit=2))
    assert [type(a) for a in answers[:12]] == [httpx.ConnectError] * 12
    assert all(isinstance(a, httpx.Response) for a in answers[12:])
    assert inner.most <= 2


@pytest.mark.parametrize("connections", [1, 32])
def test_the_simulations_client_is_bounded_by_its_connections(connections):
    async def make() -> Simulation:
        sim = Simulation("http://127.0.0.1:9", "join", F.build_fleet("cpu:1"), max_connections=connections)
        await sim.client.aclose()
        return sim

    transport = asyncio.run(make()).client._transport
    assert isinstance(transport, BoundedTransport)
    assert transport.slots._value == connections
