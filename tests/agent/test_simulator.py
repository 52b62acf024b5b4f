"""The simulator: fleets from captures, faults, and a real control plane it keeps live."""

from __future__ import annotations

import asyncio
import time

import pytest

from agent.simulator import fleet as F
from agent.simulator.runner import Simulation
from inventory.bounds import report_bounds
from inventory.report_schema import report_problems
from tests import embedded
from tests.core.test_serve import Server


def test_a_spec_names_kinds_counts_and_fabrics():
    groups = F.parse_spec("gb200-nvl72:2, h100-hgx:4@north,h100-hgx:4@south,a100-mig:1,cpu:2")
    assert [(g.kind, g.count, g.fabric) for g in groups] == [
        ("gb200-nvl72", 2, None),
        ("h100-hgx", 4, "north"),
        ("h100-hgx", 4, "south"),
        ("a100-mig", 1, None),
        ("cpu", 2, None),
    ]


@pytest.mark.parametrize("spec", ["", "gpu:2", "h100-hgx", "h100-hgx:x", "h100-hgx:2@", "cpu:1@two words"])
def test_a_bad_spec_says_what_to_write(spec):
    with pytest.raises(F.SpecError):
        F.parse_spec(spec)


def test_a_rack_is_eighteen_trays_of_four_sharing_one_domain():
    nodes = F.build_fleet("gb200-nvl72:2")
    assert len(nodes) == 36
    racks = {}
    for node in nodes:
        report = node.report()
        assert len(report["gpus"]) == 4 and report["imex"]["state"] == "up"
        domains = {(g["fabric"]["cluster_uuid"], g["fabric"]["clique_id"]) for g in report["gpus"]}
        assert len(domains) == 1
        racks.setdefault(node.rack, set()).update(domains)
    assert len(racks) == 2 and all(len(d) == 1 for d in racks.values())
    assert racks["nvl72-00"] != racks["nvl72-01"], "each rack is its own domain"
    uuids = [g["uuid"] for n in nodes for g in n.gpus]
    assert len(set(uuids)) == len(uuids) == 144


def test_other_kinds_come_from_their_captures():
    hgx, mig, cpu = F.build_fleet("h100-hgx:1@north,a100-mig:1,cpu:1")
    assert [g["class"] for g in hgx.gpus] == ["h100-80g"] * 8
    assert all(g["fabric"]["cluster_uuid"].strip("0-") == "" for g in hgx.gpus), "an HGX's NVSwitch is no domain"
    assert hgx.report()["fabrics"] == {"north": sorted({p["hca"] for p in hgx.ib_ports})}
    assert all(g["class"].startswith("a100-80g-mig-") and g["index"] >= 1000 for g in mig.gpus)
    assert cpu.gpus == [] and cpu.report()["engines"] == {"llamacpp": "0.3.16"}


def test_faults_change_what_a_node_reports():
    tray = F.build_fleet("gb200-nvl72:1")[3]
    F.tray_leave(tray)
    assert {g["fabric"]["state"] for g in tray.report()["gpus"]} == {"In Progress"}
    F.tray_rejoin(tray)
    assert {g["fabric"]["state"] for g in tray.report()["gpus"]} == {"Completed"}
    F.imex_down(tray)
    assert tray.report()["imex"]["state"] == "down"
    F.degrade(tray, 2)
    assert tray.report()["gpus"][2]["fabric"]["degraded"] is True
    F.gpu_lost(tray, 1)
    assert tray.report()["gpus"][1]["health"]
    with pytest.raises(F.FaultError):
        F.gpu_lost(tray, 9)


def test_xid_and_ecc_faults_report_what_the_agent_would_and_pass_the_schema():
    node = F.build_fleet("h100-hgx:1")[0]
    F.xid(node, 3, 79, at=1_780_000_000.0)
    F.xid(node, 3, 79, at=1_780_000_001.0)
    F.ecc(node, 5)
    gpus = node.report()["gpus"]
    assert [x["code"] for x in gpus[3]["xids"]] == [79, 79]
    assert gpus[3]["health"] == ["Xid 79 (2 times) in the kernel log, last: GPU has fallen off the bus."]
    assert gpus[5]["ecc"]["volatile"]["dram_uncorrectable"] == 1
    assert report_problems(node.report(), report_bounds()) == []
    for _ in range(40):
        F.xid(node, 0, 13)
    assert len(node.report()["gpus"][0]["xids"]) == F.MAX_XIDS


class Inventory:
    """Reads the served control plane's database directly, as a person with psql would."""

    def __init__(self, server: Server) -> None:
        self.data = server.data

    def rows(self, sql: str, *args):
        return embedded.rows(self.data, sql.replace("?", "%s"), args)

    def value(self, sql: str, *args):
        return self.rows(sql, *args)[0][0]


def test_a_partition_fault_silences_the_matching_nodes_for_its_seconds_and_keeps_their_engines():
    async def scenario() -> None:
        nodes = F.build_fleet("h100-hgx:4,cpu:1")
        # Nothing listens there: the loops retry, which is all this needs of them.
        sim = Simulation("http://127.0.0.1:9", "join", nodes, heartbeat_interval_s=0.1, run_shards=False)
        await sim.start()
        try:
            engines = {name: sim.shards[name] for name in sim.nodes}
            assert sim.apply("partition hgx-00[12] 0.5") == "partition hgx-00[12] 0.5: done"
            assert sim.cut_off == {"hgx-001", "hgx-002"}
            assert {"hgx-000", "hgx-003", "cpu-00"} <= set(sim.running)
            assert not {"hgx-001", "hgx-002"} & set(sim.running)
            assert all(sim.nodes[n].alive for n in sim.nodes), "cut off, not dead"
            assert sim.shards == engines, "their engines keep running"
            await until(lambda: not sim.cut_off, timeout=5, what="the partition to heal")
            assert set(sim.running) == set(sim.nodes)
            with pytest.raises(F.FaultError, match="no simulated node matches"):
                sim.apply("partition gb200-* 1")
            with pytest.raises(F.FaultError, match="partition NODE-PATTERN SECONDS"):
                sim.apply("partition hgx-*")
        finally:
            await sim.stop()

    asyncio.run(scenario())


async def until(check, timeout: float = 30.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.2)


@pytest.mark.slow
def test_a_simulated_fleet_stays_live_dies_comes_back_and_survives_a_fabric_manager_restart(tmp_path):
    server = Server(
        tmp_path,
        LLMGW_EVERY_REACHABILITY="1",
        LLMGW_NODE_GRACE_S="4",
        LLMGW_NODE_LOST_AFTER_S="6",
        LLMGW_DOMAIN_LOST_AFTER_S="300",
    )
    try:
        server.wait_ready()
        join = (server.data / "join-token").read_text().strip()
        inv = Inventory(server)
        asyncio.run(scenario(server, join, inv))
    finally:
        assert server.stop() == 0


async def scenario(server: Server, join: str, inv: Inventory) -> None:
    nodes = F.build_fleet("gb200-nvl72:1,h100-hgx:2,cpu:1")
    sim = Simulation(f"http://{server.admin}", join, nodes, heartbeat_interval_s=1.0, report_interval_s=60)
    await sim.start()
    try:
        await sim.wait_registered(timeout=60)
        await until(lambda: inv.value("select count(*) from inventory_gpu") == 72 + 16, what="every GPU stored")
        assert inv.value("select count(*) from inventory_node where reachable") == 21
        assert inv.value("select count(*) from inventory_nvlinkdomain") == 1
        assert inv.value("select count(*) from inventory_gpu where domain_id is not null") == 72

        # A node dies: unreachable within the grace, then lost; revived, it is back.
        sim.kill("hgx-000")
        await until(
            lambda: inv.value("select reachable from inventory_node where name='hgx-000'") == 0,
            timeout=15,
            what="hgx-000 unreachable",
        )
        sim.revive("hgx-000")
        await until(
            lambda: inv.value("select reachable from inventory_node where name='hgx-000'") == 1,
            timeout=15,
            what="hgx-000 back",
        )

        # A partition: both HGX nodes fall silent for 8 s, then answer again by themselves.
        sim.apply("partition hgx-* 8")
        await until(
            lambda: inv.value("select count(*) from inventory_node where name like 'hgx-%' and not reachable") == 2,
            timeout=15,
            what="the HGX nodes unreachable",
        )
        await until(
            lambda: inv.value("select count(*) from inventory_node where name like 'hgx-%' and reachable") == 2,
            timeout=20,
            what="the HGX nodes back",
        )

        # A fabric manager restart: every card leaves the domain, then rejoins; no node is lost.
        sim.fm_restart("nvl72-00", seconds=4)
        await until(
            lambda: inv.value("select count(*) from inventory_gpu where domain_id is not null") == 0,
            timeout=15,
            what="every card leaving the domain",
        )
        assert inv.value("select count(*) from inventory_node where reachable") == 21
        await until(
            lambda: inv.value("select count(*) from inventory_gpu where domain_id is not null") == 72,
            timeout=20,
            what="every card rejoining",
        )
        assert inv.value("select count(*) from inventory_node where lost or not reachable") == 0
        assert inv.value("select count(*) from inventory_nvlinkdomain") == 1, "the same domain, kept"
    finally:
        await sim.stop()


@pytest.mark.slow
def test_each_simulated_fabric_uploads_its_scan(tmp_path):
    server = Server(tmp_path, LLMGW_EVERY_PLAN_SCANS="1")
    try:
        server.wait_ready()
        join = (server.data / "join-token").read_text().strip()
        inv = Inventory(server)

        async def scenario() -> None:
            sim = Simulation(
                f"http://{server.admin}",
                join,
                F.build_fleet("h100-hgx:2@north,h100-hgx:2@south"),
                heartbeat_interval_s=0.5,
                report_interval_s=1.0,
            )
            await sim.start()
            try:
                await until(
                    lambda: inv.value("select count(*) from inventory_fabricscan where output != ''") == 2,
                    timeout=30,
                    what="a scan of each fabric",
                )
                scanners = {
                    row[0]
                    for row in inv.rows(
                        "select n.name from inventory_fabricscan s join inventory_node n on n.id = s.node_id"
                    )
                }
                assert scanners == {"hgx-000", "hgx-002"}
            finally:
                await sim.stop()

        asyncio.run(scenario())
    finally:
        assert server.stop() == 0
