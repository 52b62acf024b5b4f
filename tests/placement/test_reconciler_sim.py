"""A simulated fleet with fake engines, against ``llmgw serve``: models from the catalog file reach ``ready``.

The whole control path runs for real: the catalog file is loaded by the beat,
the reconciler places the replicas, the heartbeat answers tell the simulated
agents what to run, their fake engines start and report ready with
endpoints, and those endpoints answer OpenAI-style requests with usage.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from agent.simulator import fleet as F
from agent.simulator.runner import Simulation
from tests.agent.test_simulator import Inventory, until
from tests.core.test_serve import Server

pytestmark = pytest.mark.slow

CATALOG = """
models:
  - name: sim-chat
    source: file:///dev/null
    scaling: {min: 3, max: 3}
    profiles:
      - {name: h100, engine: vllm, gpu_class: h100-80g, gpus: 2, tp: 2}
  - name: sim-small
    source: file:///dev/null
    scaling: {min: 1, max: 1}
    profiles:
      - {name: cpu, engine: llamacpp, gpu_class: cpu, memory_gb: 8, gpus: 0}
"""


def test_a_simulated_fleet_gets_replicas_ready_with_endpoints_that_answer(tmp_path):
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(CATALOG)
    server = Server(
        tmp_path,
        LLMGW_CATALOG_FILE=str(catalog),
        LLMGW_EVERY_RECONCILE="1",
        LLMGW_EVERY_CATALOG_FILE="1",
    )
    try:
        server.wait_ready()
        join = (server.data / "join-token").read_text().strip()
        asyncio.run(scenario(server, join, Inventory(server)))
    finally:
        assert server.stop() == 0, server.log.read_text()
    assert "Traceback" not in server.log.read_text(), server.log.read_text()


def ready_replicas(inv: Inventory, model: str) -> list[tuple[str, str]]:
    return inv.rows(
        "select r.id, r.endpoint from placement_replica r join catalog_catalogmodel m on m.id = r.model_id "
        "where m.name = ? and r.state = 'ready'",
        model,
    )


async def scenario(server: Server, join: str, inv: Inventory) -> None:
    sim = Simulation(
        f"http://{server.admin}",
        join,
        F.build_fleet("h100-hgx:1,cpu:1"),
        heartbeat_interval_s=0.5,
        report_interval_s=60,
    )
    await sim.start()
    try:
        await sim.wait_registered(timeout=60)
        await until(lambda: len(ready_replicas(inv, "sim-chat")) == 3, timeout=60, what="three sim-chat replicas ready")
        await until(lambda: len(ready_replicas(inv, "sim-small")) == 1, timeout=30, what="sim-small ready")

        shards = inv.rows(
            "select s.gpu_indices, n.name from placement_shard s join inventory_node n on n.id = s.node_id "
            "join placement_replica r on r.id = s.replica_id join catalog_catalogmodel m on m.id = r.model_id "
            "where m.name = 'sim-chat'"
        )
        gpus = [g for indices, _ in shards for g in indices]
        assert len(gpus) == 6 and len(set(gpus)) == 6, "no GPU is given twice"
        assert {node for _, node in shards} == {"hgx-000"}
        (small,) = ready_replicas(inv, "sim-small")
        assert inv.value("select count(*) from placement_shard s where s.replica_id = ?", small[0]) == 1

        async with httpx.AsyncClient(timeout=10) as client:
            endpoints = {e for _, e in ready_replicas(inv, "sim-chat")}
            assert len(endpoints) == 3 and all(e.startswith("http://127.0.0.1:") for e in endpoints)
            for endpoint in endpoints:
                answer = await client.post(
                    f"{endpoint}/v1/chat/completions",
                    json={"model": "sim-chat", "messages": [{"role": "user", "content": "say something short"}]},
                )
                body = answer.json()
                assert answer.status_code == 200 and body["choices"][0]["message"]["content"]
                assert body["usage"]["prompt_tokens"] == 3 and body["usage"]["completion_tokens"] > 0

            endpoint = sorted(endpoints)[0]
            stream = await client.post(
                f"{endpoint}/v1/chat/completions",
                json={
                    "model": "sim-chat",
                    "stream": True,
                    "stream_options": {"include_usage": True},
                    "max_tokens": 5,
                    "messages": [{"role": "user", "content": "count"}],
                },
            )
            events = [line[6:] for line in stream.text.splitlines() if line.startswith("data: ")]
            assert events[-1] == "[DONE]"
            chunks = [json.loads(e) for e in events[:-1]]
            text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
            assert len(text.split()) == 5
            assert chunks[-1]["usage"] == {"prompt_tokens": 1, "completion_tokens": 5, "total_tokens": 6}
            models = (await client.get(f"{endpoint}/v1/models")).json()
            assert models["data"][0]["id"] == "sim-chat"
            embedded = (await client.post(f"{endpoint}/v1/embeddings", json={"input": ["a b", "c"]})).json()
            assert len(embedded["data"]) == 2 and embedded["usage"]["prompt_tokens"] == 3

        # The catalog file changes: the removed model's replicas stop and its fake engines go away.
        server_catalog = server.data.parent / "catalog.yaml"
        server_catalog.write_text(CATALOG.split("  - name: sim-small")[0])
        await until(lambda: not ready_replicas(inv, "sim-small"), timeout=30, what="sim-small gone")
        await until(lambda: not sim.shards["cpu-00"].shards, timeout=30, what="the cpu node's engine stopped")
    finally:
        await sim.stop()
