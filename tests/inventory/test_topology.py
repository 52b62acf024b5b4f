"""The map the console draws, built from real scans."""

from __future__ import annotations

import json
from typing import Any

import pytest

from inventory.ibnetdiscover import parse
from inventory.topology import NO_SWITCH, build_view, switch_label
from tests.captures import read

SUPERPOD = "ibnetdiscover_dgx-superpod_ndr_full-fabric.txt"


@pytest.fixture(scope="module")
def superpod() -> dict[str, Any]:
    # Two of the cluster's own adapters, given in the spellings the agent
    # might use: sysfs colons for one, ibstat's 0x for the other.
    return build_view(
        parse(read(SUPERPOD)),
        {"e09d:7303:007a:5a68": ("gpu-17", "mlx5_5"), "0xE09D730300156FF6": ("gpu-58", "mlx5_6")},
    )


def test_superpod_leaves_and_spines(superpod: dict[str, Any]) -> None:
    counts = superpod["counts"]
    assert (counts["switches"], counts["leaves"], counts["spines"], counts["other_switches"]) == (40, 31, 9, 0)
    roles = {s["label"]: s["role"] for s in superpod["switches"]}
    # The site named them; the classification comes from the cables alone and agrees.
    assert all(("IBLEAF" in label) == (role == "leaf") for label, role in roles.items())
    assert all(("IBSPINE" in label) == (role == "spine") for label, role in roles.items())
    # Spines are listed first, then leaves, as the drawing stacks them.
    assert [s["role"] for s in superpod["switches"]] == ["spine"] * 9 + ["leaf"] * 31


def test_superpod_every_host_hangs_under_a_leaf(superpod: dict[str, Any]) -> None:
    leaves = {s["guid"]: s for s in superpod["switches"] if s["role"] == "leaf"}
    hosts = [h for h in superpod["hosts"] if h["kind"] == "host"]
    assert len(hosts) == superpod["counts"]["hosts"] == 542
    assert all(h["leaf"] in leaves for h in hosts)
    assert all(h["guid"] in leaves[h["leaf"]]["hosts"] for h in hosts)
    assert sum(len(leaf["hosts"]) for leaf in leaves.values()) == 542


def test_superpod_sharp_nodes_sit_in_their_own_switch(superpod: dict[str, Any]) -> None:
    sharp = [h for h in superpod["hosts"] if h["kind"] == "aggregation"]
    assert len(sharp) == superpod["counts"]["aggregation_nodes"] == 40
    switches = {s["guid"]: s for s in superpod["switches"]}
    assert all(switches[a["leaf"]]["aggregation_node"] == a["guid"] for a in sharp)
    # A spine's SHARP node does not make it a leaf.
    spines = [s for s in superpod["switches"] if s["role"] == "spine"]
    assert all(s["aggregation_node"] and not s["hosts"] and s["switch_links"] > 0 for s in spines)


def test_superpod_links_are_up_at_the_common_rate(superpod: dict[str, Any]) -> None:
    assert superpod["common_gbps"] == 400.0
    assert len(superpod["links"]) == 1114
    assert {link["state"] for link in superpod["links"]} == {"up"}
    tiers = {link["tier"] for link in superpod["links"]}
    assert tiers == {"host", "fabric"}
    assert superpod["problems"] == []


def test_superpod_marks_the_clusters_own_adapters(superpod: dict[str, Any]) -> None:
    ours = {h["guid"]: (h["node"], h["hca"]) for h in superpod["hosts"] if h["node"]}
    assert ours == {"0xe09d7303007a5a68": ("gpu-17", "mlx5_5"), "0xe09d730300156ff6": ("gpu-58", "mlx5_6")}
    assert superpod["counts"]["ours"] == 2


def test_superpod_view_is_json(superpod: dict[str, Any]) -> None:
    assert json.loads(json.dumps(superpod)) == superpod


def test_a_host_is_found_by_its_port_guid_too() -> None:
    fmap = parse(read("ibnetdiscover-p_edr-fabric-excerpt.txt"))
    view = build_view(fmap, {"7cfe:9003:003b:4bde": ("o0001", "mlx5_0")})
    host = next(h for h in view["hosts"] if h["guid"] == "0x7cfe9003003b4bde")
    assert (host["node"], host["hca"]) == ("o0001", "mlx5_0")
    leaf = next(s for s in view["switches"] if s["guid"] == host["leaf"])
    assert leaf["label"] == "ib-i1l1s01"
    assert leaf["role"] == "leaf"
    roles = {s["label"]: s["role"] for s in view["switches"]}
    assert roles == {"ib-i1l1s01": "leaf", "ib-i4l1s01": "leaf", "ib-i1l2s01": "spine", "ib-i7l2s01": "other"}


def test_isolated_adapter_says_no_switch_was_seen() -> None:
    view = build_view(parse(read("ibnetdiscover_gb200-node_isolated-hca_bad.txt")), {})
    assert view["problems"] == [NO_SWITCH]
    assert NO_SWITCH.lower().startswith(
        "no switch seen: the adapter is not cabled to a fabric, or the scan ran from an isolated port"
    )
    assert view["counts"]["switches"] == 0
    assert view["hosts"][0]["leaf"] is None


def test_parse_warnings_reach_the_page() -> None:
    view = build_view(parse(read("ibnetdiscover-p_hdr-fabric-with-sharp-aggregation-node.txt")))
    assert any("two runs" in p for p in view["problems"])
    assert view["counts"]["aggregation_nodes"] == 1
    assert view["counts"]["hosts"] == 1


SLOW = """\
SW 1 1 0x0000000000000001 4x HDR - CA 10 1 0x00000000000000a1 ( 'leaf' - 'gpu-1 mlx5_0' )
SW 1 2 0x0000000000000001 4x HDR - CA 11 1 0x00000000000000a2 ( 'leaf' - 'gpu-2 mlx5_0' )
SW 1 3 0x0000000000000001 2x HDR - CA 12 1 0x00000000000000a3 ( 'leaf' - 'gpu-3 mlx5_0' )
SW 1 4 0x0000000000000001 4x HDR - SW 2 1 0x0000000000000002 ( 'leaf' - 'spine' )
CA 13 1 0x00000000000000a4 4x HDR - CA 14 1 0x00000000000000a5 ( 'gpu-4 mlx5_0' - 'gpu-5 mlx5_0' )
"""


def test_a_slow_link_is_degraded_and_named() -> None:
    view = build_view(parse(SLOW), {"0xa3": ("gpu-3", "mlx5_0")})
    states = {(link["a"], link["b"]): link["state"] for link in view["links"]}
    assert states[("0x0000000000000001", "0x00000000000000a3")] == "degraded"
    assert list(states.values()).count("degraded") == 1
    assert view["common_gbps"] == 200.0
    slow = [p for p in view["problems"] if "below" in p]
    assert len(slow) == 1
    assert "leaf port 3 – gpu-3 mlx5_0 port 1 at 2xHDR" in slow[0]
    assert "200 Gb/s" in slow[0]


def test_adapters_cabled_to_no_switch_are_named() -> None:
    view = build_view(parse(SLOW), {"0x00000000000000a4": ("gpu-4", "mlx5_0")})
    loose = [p for p in view["problems"] if "cabled to no switch" in p]
    assert len(loose) == 2
    assert any("gpu-4 mlx5_0 (0x00000000000000a4)" in p for p in loose)


def test_bad_host_keys_are_ignored() -> None:
    view = build_view(parse(SLOW), {"not a guid": ("x", "y"), "0xa1": ("only-one",)})  # type: ignore[dict-item]
    assert view["counts"]["ours"] == 0


@pytest.mark.parametrize(
    ("description", "label"),
    [
        ("MF0;A09-P1-IBLEAF-04-04:MQM9701/U1", "A09-P1-IBLEAF-04-04"),
        ("5FB0405-leaf-IB01", "5FB0405-leaf-IB01"),
        ("", "0x01"),
    ],
)
def test_switch_labels(description: str, label: str) -> None:
    assert switch_label(description, "0x01") == label
