"""The suite's world: one live server, two registered nodes with replicas, a served model, a key.

Node A (``hgx-000``, fabric north) is the one that sends mutants; node B
(``hgx-001``, fabric south) shares a two-node replica with it (rank 0 on B,
rank 1 on A) and holds a replica and a scan of its own; no request of A's may
change any of B's rows. Their reports are the simulator's, built from the
real captures in ``../shared/fixtures`` by the real discovery code.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from agent.protocol import report_digest
from agent.simulator import fleet as F
from tests.gateway.fake_engine import Behaviour, EngineThread
from tests.hostile.live import HEARTBEAT_FLUSH_S, Database, Orm, Serve, Store
from tests.hostile.probe import Owned, Prober

A, B, C = "hgx-000", "hgx-001", "hostile-c"
SETTLE_TIMEOUT_S = 5.0


def machine_id(name: str) -> str:
    return F._uuid("machine", name)


def with_weights(report: dict, node: str) -> dict:
    """A report that also lists weights on disk and the load, as a real agent's does."""
    out = copy.deepcopy(report)
    out["weights"] = [{"path": f"/models/old-{node}", "name": "old", "bytes": 10**9}]
    out["load"] = {"cpu_percent": 3.5, "load1": 0.25}
    return out


@dataclass
class Hostile:
    """Everything a surface's test needs: the server, its store, the nodes' documents and credentials."""

    root: Path
    db: Database = field(init=False)
    serve: Serve = field(init=False)
    store: Store = field(init=False)
    orm: Orm = field(init=False)
    engine: EngineThread = field(init=False)
    prober: Prober = field(init=False)
    admin: httpx.Client = field(init=False)
    agent: httpx.Client = field(init=False)
    gateway: httpx.Client = field(init=False)
    reports: dict[str, dict] = field(default_factory=dict)
    beats: dict[str, dict] = field(default_factory=dict)
    credentials: dict[str, str] = field(default_factory=dict)
    node_ids: dict[str, int] = field(default_factory=dict)
    ids: dict[str, Any] = field(default_factory=dict)
    fabrics: dict[str, str] = field(default_factory=dict)
    fabric_ids: dict[str, str] = field(default_factory=dict)

    def start(self) -> None:
        self.db = Database()
        self.serve = Serve(self.root, self.db.url)
        self.serve.wait_ready()
        self.store = Store(self.db.url)
        # Refusing (400) what a real engine would, so what the suite counts is the gateway's own doing.
        self.engine = EngineThread(Behaviour(tokens=4, refuse_unreadable=True))
        self.engine.engine.stats.keep_bodies = False
        self.admin = httpx.Client(
            base_url=f"http://{self.serve.admin}",
            headers={"Authorization": f"Bearer {self.serve.secret('admin-token')}"},
            timeout=30,
        )
        self.agent = httpx.Client(base_url=f"http://{self.serve.admin}/api/v1/agent", timeout=30)
        self.gateway = httpx.Client(base_url=f"http://{self.serve.gateway}", timeout=30)
        self.orm = Orm(self.serve.env)
        self.prober = Prober(self.serve, self.store)
        self._fleet()

    def stop(self) -> None:
        for closing in ("admin", "agent", "gateway"):
            if hasattr(self, closing):
                getattr(self, closing).close()
        for part in ("orm", "engine", "serve", "store"):
            if hasattr(self, part):
                getattr(self, part).close() if part in ("orm", "store") else getattr(self, part).stop()
        if hasattr(self, "db"):
            self.db.drop()

    # --- the fleet ------------------------------------------------------------

    def _fleet(self) -> None:
        north, south = F.build_fleet("h100-hgx:1@north,h100-hgx:1@south")
        self.reports = {A: with_weights(north.report(), A), B: with_weights(south.report(), B)}
        for name in (A, B):
            self.register(name, self.reports[name])
        self.register(C, None)
        self.ids = self.orm.call("setup", a=A, b=B, engine_url=self.engine.url)
        self.beats = {name: self.base_beat(name) for name in (A, B)}
        for name in (A, B):
            answer = self.beat(name, self.beats[name])
            assert answer.status_code == 200, answer.text
        self.wait_ready_replicas()
        self.fabrics, self.fabric_ids = self._fabric_keys()
        scan = self.orm.call("arm_scan", node=B, fabric=self.fabrics[B])
        assert scan is not None, "the planner did not hand node B its fabric's scan"
        self.prober.forget()

    def register(self, name: str, report: dict | None) -> None:
        body: dict[str, Any] = {"name": name, "machine_id": machine_id(name)}
        if report is not None:
            body["report"] = report
        join = self.serve.secret("join-token")
        answer = self.agent.post("/register", json=body, headers={"Authorization": f"Bearer {join}"})
        assert answer.status_code in (200, 201), answer.text
        self.credentials[name] = answer.json()["credential"]
        self.node_ids[name] = self.store.value("SELECT id FROM inventory_node WHERE name = %s", name)

    def base_beat(self, name: str) -> dict:
        """What the node's agent would send once its shards run: each ready, rank 0 with its endpoint."""
        ra, rb, rab = self.ids["ra"], self.ids["rb"], self.ids["rab"]
        endpoint = f"{self.engine.url}/{name}"
        if name == A:
            shards = [
                {
                    "id": f"{ra}-0",
                    "replica": ra,
                    "rank": 0,
                    "state": "ready",
                    "endpoint": endpoint,
                    "fetch": {"source": "hf://meta-llama/Llama-3.1-8B-Instruct", "bytes_done": 16 * 10**9},
                    "phases": {"fetch_s": 95.5, "load_s": 41.25, "weights_local": False},
                    "adapters": ["hostile-chat-sql"],
                },
                {"id": f"{rab}-1", "replica": rab, "rank": 1, "state": "ready", "log_tail": ["INFO: rank 1 up"]},
            ]
        else:
            shards = [
                {"id": f"{rb}-0", "replica": rb, "rank": 0, "state": "ready", "endpoint": endpoint},
                {"id": f"{rab}-0", "replica": rab, "rank": 0, "state": "ready", "endpoint": endpoint},
            ]
        return {
            "load": {"cpu_percent": 12.5, "load1": 1.0},
            "shards": shards,
            "report_digest": report_digest(self.reports[name]),
            "collected": [{"path": f"/models/old-{name}", "error": "not under a model directory of this node"}],
        }

    def beat(self, name: str, body: dict) -> httpx.Response:
        """A heartbeat, answered once the server's flusher has written it."""
        sent = datetime.now(UTC)
        answer = self.agent.post("/heartbeat", json=body, headers=self.auth(name))
        if answer.status_code == 200:
            self.wait_flushed(name, sent)
        return answer

    def auth(self, name: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.credentials[name]}"}

    def wait_flushed(self, name: str, sent: datetime) -> str | None:
        """Wait until the flush that writes a beat taken at ``sent`` is over; None, or why it never was.

        Seeing the node's ``last_seen`` move says the flush began writing; what
        follows in the same flush (shards, collections) is over once a beat of
        node C, sent after that, is written too: flushes run one after another.
        """
        if problem := self._wait_seen(name, sent):
            return problem
        marker = datetime.now(UTC)
        self.agent.post("/heartbeat", json={}, headers=self.auth(C))
        return self._wait_seen(C, marker)

    def _wait_seen(self, name: str, since: datetime) -> str | None:
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        while time.monotonic() < deadline:
            seen = self.store.value("SELECT last_seen FROM inventory_node WHERE id = %s", self.node_ids[name])
            if seen is not None and seen >= since:
                return None
            if "heartbeat flush failed" in self.serve.log.peek():
                return "the beat was never written: the server's flush of it failed"
            time.sleep(HEARTBEAT_FLUSH_S / 2)
        return f"the beat was never written ({SETTLE_TIMEOUT_S:.0f} s)"

    def wait_ready_replicas(self) -> None:
        wanted = [self.ids["ra"], self.ids["rb"], self.ids["rab"], self.ids["rg"]]
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        while time.monotonic() < deadline:
            ready = self.store.value(
                "SELECT count(*) FROM placement_replica WHERE id = ANY(%s) AND state = 'ready'", wanted
            )
            if ready == len(wanted):
                return
            time.sleep(0.05)
        raise AssertionError(f"the replicas never became ready:\n{self.serve.log_path.read_text()[-3000:]}")

    def _fabric_keys(self) -> tuple[dict[str, str], dict[str, str]]:
        """Each node's physical fabric: its key (what a scan names) and its id (what a URL names)."""
        answer = self.admin.get("/api/v1/fabrics")
        assert answer.status_code == 200, answer.text
        keys: dict[str, str] = {}
        ids: dict[str, str] = {}
        for fabric in answer.json().get("physical", []):
            for node in fabric.get("nodes", []):
                keys.setdefault(node, fabric["key"])
                ids.setdefault(node, fabric["id"])
        assert {A, B} <= set(keys), f"no fabric found for each node: {answer.json()}"
        return keys, ids

    def owned_b(self) -> Owned:
        return Owned(self.node_ids[B], B, self.store.owned_by(self.node_ids[B], B))
