"""Replicas across nodes: inside one NVLink domain first, then inside one InfiniBand fabric, never across two."""

from __future__ import annotations

from dataclasses import replace

from placement.scheduler import plan
from tests.placement.fleet import (
    domain_key,
    hgx_h100,
    model,
    nvl72_rack,
    placed_on,
    profile,
    reasons,
    replica,
    snapshot,
    tray,
)

GB200 = "gb200-186g"


def gb200(nodes: int, name: str = "default") -> object:
    return profile(name, gpu_class=GB200, gpus=4, nodes=nodes)


def test_a_multi_node_replica_goes_inside_an_nvlink_domain_and_is_told_so():
    p = plan(snapshot(nvl72_rack("rack-a"), [model("deepseek", gb200(4))]))

    [new] = p.create
    assert new.nvlink_domain == domain_key("rack-a")
    assert new.fabric is None
    assert [s.node for s in new.shards] == [tray("rack-a", t) for t in range(4)]
    for rank, shard in enumerate(new.shards):
        assert shard.rank == rank
        assert shard.gpus == (0, 1, 2, 3)
        assert shard.env["NCCL_MNNVL_ENABLE"] == "1"
        assert shard.env["LLMGW_NODE_RANK"] == str(rank)
        assert shard.env["LLMGW_NNODES"] == "4"
        assert shard.env["LLMGW_MASTER_NODE"] == tray("rack-a", 0)


def test_a_rack_with_one_tray_not_joined_places_on_the_other_trays():
    rack = nvl72_rack("rack-a", not_joined={5: {3: "In Progress"}}, fabric=None)
    p = plan(snapshot(rack, [model("wide", gb200(17))]))

    [new] = p.create
    assert new.nvlink_domain == domain_key("rack-a")
    assert tray("rack-a", 5) not in new.nodes
    assert len(new.nodes) == 17


def test_a_replica_needing_the_whole_rack_names_the_tray_that_has_not_joined():
    rack = nvl72_rack("rack-a", not_joined={5: {3: "In Progress"}}, fabric=None)
    p = plan(snapshot(rack, [model("whole-rack", gb200(18))]))

    assert p.create == ()
    assert p.unplaceable == ("whole-rack",)
    lines = reasons(p, "whole-rack")
    assert f"NVLink domain {domain_key('rack-a')}: 17 nodes can take a shard of 4 {GB200}, needs 18" in lines
    assert f"{tray('rack-a', 5)}: 3 of 4 cards joined {domain_key('rack-a')}; gpu 3 fabric state In Progress" in lines


def test_a_tray_none_of_whose_cards_joined_says_so():
    rack = nvl72_rack("rack-a", trays=2, not_joined={1: dict.fromkeys(range(4), "In Progress")}, fabric=None)
    p = plan(snapshot(rack, [model("pair", gb200(2))]))
    assert any(
        line.startswith(f"{tray('rack-a', 1)}: 0 of 4 cards joined; gpu 0 fabric state In Progress")
        for line in reasons(p, "pair")
    )


def test_a_tray_whose_registration_failed_says_so():
    """Azure's capture: Completed, with NVML's Insufficient Resources as the status. It tried and has not joined."""
    rack = nvl72_rack("rack-a", trays=2, fabric=None)
    failed = tuple(
        replace(g, fabric_state="Completed", fabric_status="Insufficient Resources", domain=None) for g in rack[1].gpus
    )
    rack[1] = replace(rack[1], gpus=failed)
    p = plan(snapshot(rack, [model("pair", gb200(2))]))
    assert any(
        line.startswith(f"{tray('rack-a', 1)}: 0 of 4 cards joined; gpu 0 fabric status Insufficient Resources")
        for line in reasons(p, "pair")
    )


def test_imex_down_keeps_a_tray_out_of_the_domain_with_that_reason():
    rack = nvl72_rack("rack-a", imex_down=[3], fabric=None)
    p = plan(snapshot(rack, [model("whole-rack", gb200(18)), model("wide", gb200(17))]))

    assert placed_on(p, "whole-rack") == []
    assert f"{tray('rack-a', 3)}: IMEX down" in reasons(p, "whole-rack")
    [wide] = p.create
    assert tray("rack-a", 3) not in wide.nodes


def test_imex_not_reported_is_not_taken_for_up():
    rack = nvl72_rack("rack-a", trays=2, imex=None, fabric=None)
    p = plan(snapshot(rack, [model("pair", gb200(2))]))
    assert p.create == ()
    assert f"{tray('rack-a', 0)}: IMEX state not reported" in reasons(p, "pair")


def test_a_full_domain_falls_back_to_infiniband_and_loses_mnnvl():
    racks = nvl72_rack("rack-a", trays=4) + nvl72_rack("rack-b", trays=4)
    busy = model("busy", gb200(1, "one"), max_replicas=4)
    held = [replica(f"r{t}", busy, (tray(rack, t), range(4))) for rack in ("rack-a", "rack-b") for t in (0, 1)]
    p = plan(snapshot(racks, [busy, model("wide", gb200(4))], held))

    [new] = placed_on(p, "wide")
    created = next(r for r in p.create if r.model == "wide")
    assert created.nvlink_domain is None
    assert created.fabric == "ib-gb"
    assert sorted(n for n, _ in new) == [tray("rack-a", 2), tray("rack-a", 3), tray("rack-b", 2), tray("rack-b", 3)]
    assert all("NCCL_MNNVL_ENABLE" not in s.env for s in created.shards)


def test_a_replica_never_spans_two_infiniband_fabrics():
    nodes = [hgx_h100("east-1", fabric="ib-east"), hgx_h100("east-2", fabric="ib-east")]
    nodes += [hgx_h100("west-1", fabric="ib-west"), hgx_h100("west-2", fabric="ib-west")]
    p = plan(snapshot(nodes, [model("three", profile(gpus=8, nodes=3))]))

    assert p.create == ()
    assert reasons(p, "three") == [
        "no h100-80g node is in a multi-node NVLink domain",
        "InfiniBand fabric ib-east: 2 entirely free nodes with 8 h100-80g, needs 3",
        "InfiniBand fabric ib-west: 2 entirely free nodes with 8 h100-80g, needs 3",
        "4 entirely free nodes in 2 fabrics, but a replica never spans two fabrics",
    ]


def test_over_infiniband_the_smallest_fabric_that_fits_is_used():
    nodes = [hgx_h100(f"east-{i}", fabric="ib-east") for i in range(4)]
    nodes += [hgx_h100(f"west-{i}", fabric="ib-west") for i in range(2)]
    p = plan(snapshot(nodes, [model("pair", profile(gpus=8, nodes=2))]))

    [new] = p.create
    assert new.fabric == "ib-west"
    assert new.nodes == ("west-0", "west-1")


def test_over_infiniband_only_entirely_free_nodes_are_used():
    small = model("small")
    nodes = [hgx_h100("east-1"), hgx_h100("east-2"), hgx_h100("east-3")]
    p = plan(snapshot(nodes, [small, model("pair", profile(gpus=4, nodes=2))], [replica("r1", small, ("east-1", [0]))]))
    [new] = p.create
    assert new.nodes == ("east-2", "east-3")


def test_a_node_with_no_fabric_and_a_busy_node_are_explained():
    small = model("small")
    nodes = [hgx_h100("east-1"), hgx_h100("lonely", fabric=None)]
    p = plan(snapshot(nodes, [small, model("pair", profile(gpus=8, nodes=2))], [replica("r1", small, ("east-1", [0]))]))
    assert reasons(p, "pair") == [
        "no h100-80g node is in a multi-node NVLink domain",
        "InfiniBand fabric ib-east: 0 entirely free nodes with 8 h100-80g, needs 2",
        "east-1: not entirely free: 1 GPU in use",
        "lonely: no InfiniBand fabric reported",
    ]


def test_inside_a_domain_a_partly_used_tray_can_take_a_smaller_shard():
    rack = nvl72_rack("rack-a", trays=2, fabric=None)
    small = model("small", profile(gpu_class=GB200, gpus=2))
    held = [replica(f"r{t}", small, (tray("rack-a", t), [0, 1])) for t in range(2)]
    p = plan(snapshot(rack, [small, model("split", profile(gpu_class=GB200, gpus=2, nodes=2))], held))
    [new] = placed_on(p, "split")
    assert new == [(tray("rack-a", 0), (2, 3)), (tray("rack-a", 1), (2, 3))]


def test_full_bandwidth_trays_are_preferred_to_degraded_ones():
    rack = nvl72_rack("rack-a", trays=4, degraded=[0, 1], fabric=None)
    p = plan(snapshot(rack, [model("pair", gb200(2))]))
    assert p.create[0].nodes == (tray("rack-a", 2), tray("rack-a", 3))


def test_many_full_domains_are_one_line_while_a_lagging_tray_keeps_its_own():
    racks = [nvl72_rack(f"rack-{r}", trays=2, fabric=None) for r in range(5)]
    racks[0] = nvl72_rack("rack-0", trays=2, fabric=None, not_joined={1: {0: "In Progress"}})
    p = plan(snapshot([n for rack in racks for n in rack], [model("wide", gb200(3))]))

    assert reasons(p, "wide") == [
        f"5 NVLink domains: too few nodes can take a shard of 4 {GB200}, needs 3 "
        f"({domain_key('rack-0')}, {domain_key('rack-1')}, {domain_key('rack-2')}, …)",
        f"{tray('rack-0', 1)}: 3 of 4 cards joined {domain_key('rack-0')}; gpu 0 fabric state In Progress",
        "10 nodes: no InfiniBand fabric reported (rack-0-tray00, rack-0-tray01, rack-1-tray00, …)",
    ]
