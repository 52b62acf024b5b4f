"""MIG: a replica runs on exactly one instance, named by its MIG UUID; a card in MIG mode is never placed whole."""

from __future__ import annotations

import pytest

from placement.scheduler import plan
from tests.placement.fleet import a100_mig, mig_uuid, model, placed_on, profile, reasons, replica, snapshot

MIG = "a100-80g-mig-3g.40gb"


def test_a_mig_profile_gets_exactly_one_instance_by_its_uuid():
    node = a100_mig("mig-01", carved={2: ["3g.40gb", "3g.40gb"]})
    p = plan(snapshot([node], [model("small", profile(gpu_class=MIG))]))

    assert placed_on(p, "small") == [[("mig-01", (1200,))]]
    assert p.create[0].shards[0].env["CUDA_VISIBLE_DEVICES"] == mig_uuid("mig-01", 2, 0)
    assert "CUDA_DEVICE_ORDER" not in p.create[0].shards[0].env


def test_each_replica_gets_its_own_instance():
    node = a100_mig("mig-01", carved={0: ["3g.40gb", "3g.40gb"]})
    small = model("small", profile(gpu_class=MIG), min_replicas=3, max_replicas=3)
    p = plan(snapshot([node], [small], [replica("r1", small, ("mig-01", [1000]))]))

    assert placed_on(p, "small") == [[("mig-01", (1001,))]]
    assert reasons(p, "small") == [f"mig-01: no {MIG} free: 2 in use"]


@pytest.mark.parametrize(
    "shape",
    [dict(gpus=2, tp=2), dict(gpus=1, tp=2, pp=1), dict(gpus=1, nodes=2, tp=2), dict(gpus=1, tp=1, pp=2)],
    ids=["gpus", "tp", "nodes", "pp"],
)
def test_a_mig_profile_asking_for_more_than_one_instance_is_refused(shape):
    node = a100_mig("mig-01", carved={c: ["3g.40gb", "3g.40gb"] for c in range(4)})
    p = plan(snapshot([node], [model("greedy", profile(gpu_class=MIG, **shape))]))

    assert p.create == ()
    assert p.unplaceable == ("greedy",)
    [line] = reasons(p, "greedy")
    assert line.startswith(f"refused: {MIG} is a MIG instance: a replica runs on exactly one")


def test_a_refused_mig_profile_falls_through_to_the_next():
    node = a100_mig("mig-01", carved={0: ["3g.40gb"]})
    m = model("m", profile("two", gpu_class=MIG, gpus=2, tp=2), profile("one", gpu_class=MIG))
    p = plan(snapshot([node], [m]))
    assert [r.profile for r in p.create] == ["one"]


def test_a_card_in_mig_mode_is_never_placed_as_a_whole_card():
    node = a100_mig("mig-01", carved={c: ["3g.40gb", "3g.40gb"] for c in range(4)})
    p = plan(
        snapshot(
            [node],
            [
                model("half", profile(gpu_class="a100-80g", gpus=4)),
                model("all", profile("x8", gpu_class="a100-80g", gpus=8)),
            ],
        )
    )
    assert placed_on(p, "half") == [[("mig-01", (4, 5, 6, 7))]]
    # "all" is planned before "half" (models go by name), so it sees the four whole cards free.
    assert reasons(p, "all") == ["mig-01: 4 a100-80g free, needs 8: 4 in MIG mode"]


def test_a_card_in_mig_mode_with_nothing_carved_is_out_of_placement_with_the_reason():
    node = a100_mig("mig-01", empty_mig=[3])
    p = plan(snapshot([node], [model("small", profile(gpu_class=MIG))]))

    assert p.create == ()
    assert reasons(p, "small") == [f"no node has {MIG} GPUs", "mig-01: gpu 3 is in MIG mode with no instances"]


def test_an_instance_without_a_reported_mig_uuid_is_not_placed():
    from dataclasses import replace

    node = a100_mig("mig-01", carved={0: ["3g.40gb"]})
    node = replace(node, gpus=tuple(replace(g, mig_uuid="") if g.parent is not None else g for g in node.gpus))
    p = plan(snapshot([node], [model("small", profile(gpu_class=MIG))]))
    assert reasons(p, "small") == [f"mig-01: no {MIG} free: 1 without a MIG UUID"]
