"""Rejections stay readable on a big fleet: many nodes with one reason become one line, a few keep their names."""

from __future__ import annotations

from placement.scheduler import plan
from tests.placement.fleet import hgx_h100, model, profile, reasons, replica, snapshot


def full_fleet(n: int):
    hog = model("hog", profile(gpus=8), min_replicas=n, max_replicas=n)
    nodes = [hgx_h100(f"h100-{i:03d}") for i in range(n)]
    held = [replica(f"r{i:03d}", hog, (f"h100-{i:03d}", range(8))) for i in range(n)]
    return nodes, hog, held


def test_many_nodes_turned_down_for_one_reason_are_one_line_naming_a_few():
    nodes, hog, held = full_fleet(412)
    p = plan(snapshot(nodes, [hog, model("late")], held))

    [line] = p.rejections["late"]
    assert line.node is None
    assert line.nodes == 412
    assert line.reason == "412 nodes: no h100-80g free (h100-000, h100-001, h100-002, …)"


def test_a_few_nodes_keep_a_line_each_with_their_specifics():
    nodes, hog, held = full_fleet(3)
    p = plan(snapshot(nodes, [hog, model("late")], held))
    assert reasons(p, "late") == [f"h100-00{i}: no h100-80g free: 8 in use" for i in range(3)]


def test_different_reasons_are_grouped_separately_in_the_order_found():
    nodes, hog, held = full_fleet(5)
    nodes += [hgx_h100(f"cordoned-{i}", state="cordoned") for i in range(4)]
    nodes += [hgx_h100("lost", reachable=False)]
    p = plan(snapshot(nodes, [hog, model("late")], held))
    assert reasons(p, "late") == [
        "4 nodes: cordoned: takes nothing new (cordoned-0, cordoned-1, cordoned-2, …)",
        "lost: unreachable",
        "5 nodes: no h100-80g free (h100-000, h100-001, h100-002, …)",
    ]


def test_a_model_that_was_placed_has_no_rejections():
    p = plan(snapshot([hgx_h100("h100-01")], [model("m")]))
    assert p.rejections == {}
    assert p.unplaceable == ()
