"""Placing replicas that fit on one machine: class, health, node state, engines, pools, locality, CPU memory."""

from __future__ import annotations

from placement.scheduler import plan
from tests.placement.fleet import (
    a100_mig,
    cpu_box,
    cpu_profile,
    hgx_h100,
    model,
    pcie_box,
    placed_on,
    profile,
    reasons,
    replica,
    snapshot,
)


def test_a_replica_lands_on_gpus_of_its_class_and_is_told_which():
    llama = model("llama-70b", profile(gpus=4))
    p = plan(snapshot([a100_mig("a100-01"), hgx_h100("h100-01")], [llama]))

    assert placed_on(p, "llama-70b") == [[("h100-01", (0, 1, 2, 3))]]
    env = p.create[0].shards[0].env
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert "NCCL_MNNVL_ENABLE" not in env
    assert p.create[0].fingerprint == llama.profiles[0].fingerprint


def test_the_profile_environment_is_passed_on_but_placement_decides_the_devices():
    p = plan(
        snapshot(
            [hgx_h100("h100-01")],
            [model("m", profile(gpus=1, env={"VLLM_USE_V1": "1", "CUDA_VISIBLE_DEVICES": "7"}))],
        )
    )
    env = p.create[0].shards[0].env
    assert env["VLLM_USE_V1"] == "1"
    assert env["CUDA_VISIBLE_DEVICES"] == "0"


def test_unhealthy_gpus_are_never_placed_on_and_the_reason_names_them():
    sick = {i: "Xid 79: GPU has fallen off the bus" for i in range(6)}
    p = plan(snapshot([hgx_h100("h100-01", unhealthy=sick)], [model("m", profile(gpus=4))]))

    assert p.create == ()
    assert p.unplaceable == ("m",)
    [line] = reasons(p, "m")
    assert line.startswith("h100-01: 2 h100-80g free, needs 4: 6 unhealthy")
    assert "gpu 0: Xid 79" in line


def test_a_full_node_says_how_its_cards_are_spent():
    box = hgx_h100("a100-01", gpu_class="a100-80g", unhealthy={7: "ECC uncorrectable"})
    busy = model("busy", profile(gpu_class="a100-80g", gpus=7))
    p = plan(
        snapshot(
            [box],
            [busy, model("late", profile(gpu_class="a100-80g"))],
            [replica("r1", busy, ("a100-01", range(7)))],
        )
    )
    assert reasons(p, "late") == ["a100-01: no a100-80g free: 7 in use, 1 unhealthy (gpu 7: ECC uncorrectable)"]


def test_a_gpu_held_by_an_existing_replica_is_not_given_again():
    old = model("old", profile(gpus=6))
    new = model("new", profile(gpus=2))
    p = plan(snapshot([hgx_h100("h100-01")], [old, new], [replica("r1", old, ("h100-01", [0, 1, 2, 4, 5, 6]))]))
    assert placed_on(p, "new") == [[("h100-01", (3, 7))]]


def test_cordoned_and_unreachable_nodes_take_nothing_new():
    nodes = [hgx_h100("h100-01", state="cordoned"), hgx_h100("h100-02", reachable=False), hgx_h100("h100-03")]
    p = plan(snapshot(nodes, [model("m", profile(gpus=8), min_replicas=2)]))

    assert placed_on(p, "m") == [[("h100-03", tuple(range(8)))]]
    assert reasons(p, "m") == [
        "h100-01: cordoned: takes nothing new",
        "h100-02: unreachable",
        "h100-03: no h100-80g free: 8 in use",
    ]


def test_a_cordoned_node_keeps_the_replicas_it_has():
    m = model("m", profile(gpus=8))
    p = plan(snapshot([hgx_h100("h100-01", state="cordoned")], [m], [replica("r1", m, ("h100-01", range(8)))]))
    assert p.create == p.stop == p.replace == ()


def test_an_agent_that_did_not_report_engines_is_not_treated_as_having_none():
    p = plan(snapshot([hgx_h100("old-agent", engines=None)], [model("m")]))
    assert placed_on(p, "m") == [[("old-agent", (0,))]]


def test_a_node_that_reported_no_engines_has_none():
    p = plan(snapshot([hgx_h100("bare", engines=()), hgx_h100("sg", engines=["sglang"])], [model("m")]))
    assert p.create == ()
    assert reasons(p, "m") == [
        "bare: engine vllm not installed (has none)",
        "sg: engine vllm not installed (has sglang)",
    ]


def test_a_pool_confines_a_profile_to_its_nodes():
    nodes = [hgx_h100("h100-01"), hgx_h100("h100-02", pool="gold")]
    p = plan(snapshot(nodes, [model("m", profile(gpus=8, pool="gold"), min_replicas=2)]))

    assert placed_on(p, "m") == [[("h100-02", tuple(range(8)))]]
    assert p.create[0].pool == "gold"
    assert reasons(p, "m") == ["h100-01: not in pool gold", "h100-02: no h100-80g free: 8 in use"]
    assert {r.pool for r in p.rejections["m"]} == {"gold"}


def test_profiles_are_tried_in_order_and_a_later_one_that_fits_explains_nothing():
    m = model("m", profile("h100x8", gpus=8), profile("a100x2", gpu_class="a100-80g", gpus=2))
    p = plan(snapshot([hgx_h100("a100-01", gpu_class="a100-80g")], [m]))
    assert [r.profile for r in p.create] == ["a100x2"]
    assert p.rejections == {}


def test_every_profile_is_explained_when_none_fits():
    m = model("m", profile("b200", gpu_class="b200-192g"), profile("big", gpus=16))
    p = plan(snapshot([hgx_h100("h100-01")], [m]))
    assert [(r.profile, r.reason) for r in p.rejections["m"]] == [
        ("b200", "no node has b200-192g GPUs"),
        ("big", "no h100-80g node has 16 GPUs of that class; the most on one is 8"),
    ]


def test_a_shard_stays_on_one_numa_node_when_it_can():
    m = model("m", profile(gpus=2))
    # NUMA 0 has 2 and 3 left, NUMA 1 is whole: the pair goes to NUMA 0 so NUMA 1 stays whole for a 4-GPU replica.
    p = plan(snapshot([hgx_h100("h100-01")], [m, model("other")], [replica("r1", model("other"), ("h100-01", [0, 1]))]))
    assert placed_on(p, "m") == [[("h100-01", (2, 3))]]


def test_a_node_whose_free_gpus_straddle_numa_is_passed_over_for_one_that_does_not():
    other = model("other", profile(gpus=6))
    tight = replica("r1", other, ("h100-01", [0, 1, 2, 5, 6, 7]))  # leaves 3 (NUMA 0) and 4 (NUMA 1)
    p = plan(snapshot([hgx_h100("h100-01"), hgx_h100("h100-02")], [other, model("m", profile(gpus=2))], [tight]))
    assert placed_on(p, "m") == [[("h100-02", (0, 1))]]


def test_gpus_that_reach_each_other_over_nvlink_are_chosen_together():
    other = model("other", profile(gpu_class="a100-80g", gpus=2))
    # Bridged pairs 0-1, 2-3, 4-5, 6-7; 1 and 2 taken leaves 0 and 3 free but unbridged.
    p = plan(
        snapshot(
            [pcie_box("pcie-01")],
            [other, model("m", profile(gpu_class="a100-80g", gpus=2))],
            [replica("r1", other, ("pcie-01", [1, 2]))],
        )
    )
    assert placed_on(p, "m") == [[("pcie-01", (4, 5))]]


def test_when_nothing_better_exists_a_shard_still_lands_across_numa():
    other = model("other", profile(gpus=6))
    p = plan(
        snapshot(
            [hgx_h100("h100-01")],
            [other, model("m", profile(gpus=2))],
            [replica("r1", other, ("h100-01", [0, 1, 2, 5, 6, 7]))],
        )
    )
    assert placed_on(p, "m") == [[("h100-01", (3, 4))]]


def test_the_tightest_node_is_filled_first_so_whole_nodes_stay_whole():
    other = model("other", profile(gpus=4))
    p = plan(
        snapshot(
            [hgx_h100("h100-01"), hgx_h100("h100-02")],
            [other, model("m", profile(gpus=4))],
            [replica("r1", other, ("h100-02", [0, 1, 2, 3]))],
        )
    )
    assert placed_on(p, "m") == [[("h100-02", (4, 5, 6, 7))]]


def test_a_cpu_profile_goes_where_the_memory_is_cpu_machines_first():
    nodes = [hgx_h100("h100-01"), cpu_box("cpu-small", memory_gb=32), cpu_box("cpu-big", memory_gb=64)]
    p = plan(snapshot(nodes, [model("phi", cpu_profile(memory_gb=48))]))

    assert placed_on(p, "phi") == [[("cpu-big", ())]]
    assert p.create[0].shards[0].env["CUDA_VISIBLE_DEVICES"] == ""


def test_a_cpu_profile_reports_memory_short_and_unknown():
    nodes = [cpu_box("cpu-01", memory_gb=64), cpu_box("cpu-02", memory_gb=None)]
    p = plan(snapshot(nodes, [model("phi", cpu_profile(memory_gb=48), min_replicas=2)]))

    assert placed_on(p, "phi") == [[("cpu-01", ())]]
    assert reasons(p, "phi") == ["cpu-02: memory not reported", "cpu-01: 16 GB of memory free, needs 48 GB"]


def test_memory_held_by_existing_cpu_replicas_is_counted():
    phi = model("phi", cpu_profile(memory_gb=48), min_replicas=2)
    p = plan(snapshot([cpu_box("cpu-01", memory_gb=64)], [phi], [replica("r1", phi, ("cpu-01", []))]))
    assert p.create == ()
    assert reasons(p, "phi") == ["cpu-01: 16 GB of memory free, needs 48 GB"]
