"""An Xid storm on one card of a simulated fleet, against ``llmgw serve``: the replica moves, the node is cordoned.

The whole path is real: the simulated agent reports the card's Xids in its full
report, ingest records them and holds the card, the reconciler places a
replacement elsewhere, the replacement's fake engine reports ready, the old
replica is stopped; more Xids on the same card cordon the node with the reason.
"""

from __future__ import annotations

import asyncio

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
    scaling: {min: 1, max: 1}
    profiles:
      - {name: h100, engine: vllm, gpu_class: h100-80g, gpus: 2, tp: 2}
"""


def test_an_xid_storm_on_one_card_drains_its_replica_and_cordons_the_node_after_the_threshold(tmp_path):
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(CATALOG)
    server = Server(
        tmp_path,
        LLMGW_CATALOG_FILE=str(catalog),
        LLMGW_EVERY_RECONCILE="1",
        LLMGW_EVERY_CATALOG_FILE="1",
        LLMGW_HEALTH_CORDON_AFTER="3",
        LLMGW_HEALTH_WINDOW_S="600",
    )
    try:
        server.wait_ready()
        join = (server.data / "join-token").read_text().strip()
        asyncio.run(scenario(join, server, Inventory(server)))
    finally:
        assert server.stop() == 0, server.log.read_text()
    assert "Traceback" not in server.log.read_text(), server.log.read_text()


def replicas(inv: Inventory) -> list[tuple[str, str, str, list[int]]]:
    """(replica, state, node, GPUs) of sim-chat."""
    rows = inv.rows(
        "select r.id, r.state, n.name, s.gpu_indices from placement_replica r "
        "join catalog_catalogmodel m on m.id = r.model_id join placement_shard s on s.replica_id = r.id "
        "join inventory_node n on n.id = s.node_id where m.name = 'sim-chat' order by r.created_at"
    )
    return [(rid, state, node, gpus) for rid, state, node, gpus in rows]


async def scenario(join: str, server: Server, inv: Inventory) -> None:
    sim = Simulation(
        f"http://{server.admin}", join, F.build_fleet("h100-hgx:2"), heartbeat_interval_s=0.5, report_interval_s=60
    )
    await sim.start()
    try:
        await sim.wait_registered(timeout=60)
        await until(lambda: [r[1] for r in replicas(inv)] == ["ready"], timeout=60, what="one sim-chat ready")
        ((old, _, node, gpus),) = replicas(inv)
        card = gpus[0]

        sim.apply(f"xid {node} {card} 79")  # GPU fallen off the bus: fatal
        await until(lambda: inv.value("select count(*) from inventory_cardhold") == 1, timeout=30, what="the card held")

        def moved() -> bool:
            rows = replicas(inv)
            ready = [r for r in rows if r[1] == "ready"]
            return len(ready) == 1 and ready[0][0] != old and not (ready[0][2] == node and card in ready[0][3])

        await until(moved, timeout=60, what="a ready replacement off the held card")
        await until(
            lambda: old not in {r[0] for r in replicas(inv) if r[1] != "stopping"}, timeout=30, what="old stopped"
        )
        assert inv.value("select state from inventory_node where name = ?", node) == "ready", "one Xid: no cordon"

        for _ in range(2):  # the storm goes on: two more on the same card
            sim.apply(f"xid {node} {card} 79")
            await asyncio.sleep(1.0)  # each in its own report
        await until(
            lambda: inv.value("select state from inventory_node where name = ?", node) == "cordoned",
            timeout=30,
            what="the node cordoned",
        )
        reason = inv.value("select health_cordon from inventory_node where name = ?", node)
        assert reason.startswith("3 card health problems within 600 s") and "Xid 79" in reason
        actions = [a for (a,) in inv.rows("select action from core_auditentry where actor = 'health' order by id")]
        assert actions == ["hold-card", "cordon"]
    finally:
        await sim.stop()
