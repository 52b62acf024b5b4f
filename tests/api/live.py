"""A live control plane (``llmgw serve`` as a subprocess) with a simulated fleet heartbeating into it.

For the end-to-end tests: the schema run and ctl driving a fleet. The fleet
runs in its own thread and event loop; replicas are written by a ``llmgw
shell`` in the server's own environment, since the reconciler that places
them belongs to another piece.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from agent.simulator import fleet as F
from agent.simulator.runner import Simulation
from tests.core.test_serve import Server

REPO = Path(__file__).resolve().parents[2]


class SimThread:
    """A Simulation on an event loop of its own, so a synchronous test can drive it."""

    def __init__(self, url: str, join: str, spec: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="simulated-fleet", daemon=True)
        self.thread.start()
        self.nodes = F.build_fleet(spec)

        async def make() -> Simulation:
            return Simulation(url, join, self.nodes, heartbeat_interval_s=2.0, report_interval_s=60, run_shards=False)

        self.sim = self.call(make())
        self.call(self.sim.start())

    def call(self, coro, timeout: float = 90):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        try:
            self.call(self.sim.stop(), timeout=30)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=10)


@dataclass
class Live:
    server: Server
    url: str
    token: str
    fleet: SimThread

    def get(self, path: str) -> httpx.Response:
        return httpx.get(self.url + path, headers={"Authorization": f"Bearer {self.token}"}, timeout=30)

    def shell(self, code: str) -> str:
        """Run Python in the server's Django (its data dir, its database): what an operator's `llmgw shell` sees."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("LLMGW_")}
        env.update(
            LLMGW_DATA_DIR=str(self.server.data),
            LLMGW_ADMIN_ADDR=self.server.admin,
            LLMGW_GATEWAY_ADDR=self.server.gateway,
        )
        done = subprocess.run(
            [sys.executable, "-m", "llmgw.cli", "shell", "-c", code],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout


@contextmanager
def live_fleet(tmp_path: Path, spec: str, expected_nodes: int) -> Iterator[Live]:
    server = Server(tmp_path)
    fleet = None
    try:
        server.wait_ready()
        token = (server.data / "admin-token").read_text().strip()
        join = (server.data / "join-token").read_text().strip()
        url = f"http://{server.admin}"
        fleet = SimThread(url, join, spec)
        live = Live(server, url, token, fleet)
        deadline = time.monotonic() + 90
        while len(live.get("/api/v1/nodes").json()) < expected_nodes:
            assert time.monotonic() < deadline, "the simulated fleet did not register:\n" + server.log.read_text()
            time.sleep(0.5)
        yield live
    finally:
        if fleet is not None:
            fleet.stop()
        if server.proc.poll() is None:
            server.stop()


PLACE = """
from tests.api.fleet import add_model, place
from inventory.models import Node
from placement.models import Shard
model = add_model()
place(model, "hgx-000", [0, 1])
fetching = place(model, "hgx-001", [0], state="starting", shard_state="fetching")
Shard.objects.filter(replica=fetching).update(fetch_source="hf://meta-llama/x", fetch_done=10**9, fetch_total=4 * 10**9)
Node.objects.filter(name="hgx-001").update(weights=[{"path": "/models/old", "name": "old", "bytes": 10**9}])
print(fetching.id)
"""
