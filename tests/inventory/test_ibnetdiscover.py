"""Reading ibnetdiscover output: every real capture, and mangled ones that must fail in words."""

from __future__ import annotations

import re
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inventory.ibnetdiscover import FabricMap, TopologyParseError, lane_gbps, normalize_guid, parse
from tests.captures import read

SUPERPOD = "ibnetdiscover_dgx-superpod_ndr_full-fabric.txt"
ISOLATED = "ibnetdiscover_gb200-node_isolated-hca_bad.txt"
EDR_PORTS = "ibnetdiscover-p_edr-fabric-excerpt.txt"
HDR_PORTS = "ibnetdiscover-p_hdr-fabric-with-sharp-aggregation-node.txt"
CAPTURES = [SUPERPOD, ISOLATED, EDR_PORTS, HDR_PORTS]


@pytest.fixture(scope="module")
def superpod() -> FabricMap:
    return parse(read(SUPERPOD))


def _assert_each_cable_once(fmap: FabricMap) -> None:
    ends = Counter(frozenset(link.ends()) for link in fmap.links)
    assert max(ends.values(), default=1) == 1


# --- the superpod: a whole NDR fabric -----------------------------------------------


def test_superpod_counts_switches_adapters_and_cables(superpod: FabricMap) -> None:
    text = read(SUPERPOD)
    assert superpod.format == "default"
    assert len(superpod.switches) == 40 == text.count("\nSwitch\t")
    assert len(superpod.cas) == 582 == text.count("\nCa\t")
    assert not superpod.routers
    # Every cable is printed from both ends: 2228 port lines are 1114 cables.
    port_lines = sum(1 for line in text.splitlines() if line.startswith("["))
    assert port_lines == 2228
    assert len(superpod.links) == port_lines // 2 == 1114
    _assert_each_cable_once(superpod)
    assert superpod.warnings == []


def test_superpod_every_cable_is_4x_ndr(superpod: FabricMap) -> None:
    assert {(link.width, link.speed, link.gbps) for link in superpod.links} == {("4x", "NDR", 400.0)}


def test_superpod_switch_block_facts(superpod: FabricMap) -> None:
    leaf = superpod.switches["0x2c5eab0300b87b40"]
    assert leaf.kind == "switch"
    assert leaf.description == "MF0;A09-P1-IBLEAF-04-04:MQM9701/U1"
    assert leaf.lid == 73
    assert leaf.ports == 65
    assert leaf.name == "S-2c5eab0300b87b40"
    assert (leaf.vendor_id, leaf.device_id, leaf.system_guid) == ("0x2c9", "0xd2f2", "0x2c5eab0300b87b40")


def test_superpod_adapter_block_facts(superpod: FabricMap) -> None:
    ca = superpod.cas["0xe09d7303007a5a68"]
    assert ca.description == "a08-p1-dgx-04-c17 mlx5_5"
    assert ca.lid == 657
    assert ca.ports == 1
    assert ca.port_guids == {1: "0xe09d7303007a5a68"}
    assert ca.device_id == "0x1021"
    assert not ca.is_aggregation_node
    # Its cable, seen from both ends, is one link to leaf A09-P1-IBLEAF-04-04 port 17.
    mine = [link for link in superpod.links if "0xe09d7303007a5a68" in (link.a_guid, link.b_guid)]
    assert len(mine) == 1
    assert set(mine[0].ends()) == {("0xe09d7303007a5a68", 1), ("0x2c5eab0300b87b40", 17)}


def test_superpod_descriptions_keep_inner_spacing(superpod: FabricMap) -> None:
    unnamed = [ca for ca in superpod.cas.values() if ca.description.startswith("MT4129")]
    assert len(unnamed) == 69  # adapters whose node description was never set
    assert {ca.description for ca in unnamed} == {"MT4129 ConnectX7   Mellanox Technologies"}


def test_superpod_sharp_aggregation_nodes_share_their_switch_image(superpod: FabricMap) -> None:
    sharp = [ca for ca in superpod.cas.values() if ca.is_aggregation_node]
    assert len(sharp) == 40
    switch_images = {s.system_guid for s in superpod.switches.values()}
    assert all(ca.system_guid in switch_images for ca in sharp)
    an = superpod.cas["0x2c5eab0300b87b50"]
    assert (an.lid, an.device_id, an.system_guid) == (193, "0xcf09", "0x2c5eab0300b87b40")


def test_superpod_names_where_the_scan_started(superpod: FabricMap) -> None:
    assert superpod.origin_guid == "0xe09d730300156ff6"
    assert superpod.origin_guid in superpod.cas


def test_superpod_leaf_spine_lids_from_port_lines(superpod: FabricMap) -> None:
    spine = superpod.switches["0x2c5eab0300c26280"]
    assert spine.description == "MF0;A10-P1-IBSPINE-02:MQM9701/U1"
    assert spine.lid == 236


# --- the isolated adapter ----------------------------------------------------------


def test_isolated_adapter_is_one_ca_and_no_links() -> None:
    fmap = parse(read(ISOLATED))
    assert not fmap.switches
    assert list(fmap.cas) == ["0xb8e92403009ca838"]
    ca = fmap.cas["0xb8e92403009ca838"]
    assert ca.description == "dgx-gb200-n01-c1 HCA-1"
    assert ca.device_id == "0x1021"
    assert ca.lid is None  # no port line: the scan never learned it
    assert fmap.links == []
    assert fmap.origin_guid == "0xb8e92403009ca838"


# --- the ports report (-p) ----------------------------------------------------------


def test_edr_ports_report() -> None:
    fmap = parse(read(EDR_PORTS))
    assert fmap.format == "ports"
    assert {g: s.description for g, s in fmap.switches.items()} == {
        "0x7cfe9003009ce5b0": "ib-i1l1s01",
        "0x506b4b03005c2740": "ib-i4l1s01",
        "0x7cfe900300b07320": "ib-i1l2s01",
        "0x08c0eb0300add20e": "ib-i7l2s01",
    }
    assert fmap.switches["0x7cfe9003009ce5b0"].lid == 1719
    assert fmap.switches["0x7cfe9003009ce5b0"].ports is None  # -p does not print it
    assert {g: (c.description, c.lid) for g, c in fmap.cas.items()} == {
        "0x7cfe9003003b4bde": ("o0001 HCA-1", 134),
        "0x7cfe9003003b4b96": ("o0002 HCA-1", 133),
        "0x506b4b0300cc02a6": ("p0001 HCA-1", 1432),
    }
    # Seven connected lines, each cable from both ends but one: four cables.
    # The two unconnected ports ("4x ???", "4x SDR") are no cable.
    assert len(fmap.links) == 4
    _assert_each_cable_once(fmap)
    assert {(link.width, link.speed, link.gbps) for link in fmap.links} == {("4x", "EDR", 100.0)}
    assert not any(link.b_port in (37, 80) or link.a_port in (37, 80) for link in fmap.links)
    assert fmap.warnings == []


def test_hdr_ports_report_trims_padded_names_and_keeps_the_sharp_node() -> None:
    fmap = parse(read(HDR_PORTS))
    descriptions = {s.description for s in fmap.switches.values()}
    assert descriptions == {
        "5FB0405-leaf-IB01",
        "5FB0406-spine-IB01",
        "5FB0406-spine-IB02",
        "5FB0406-spine-IB03",
        "Infiniscale-IV Mellanox Technologies",
    }
    sharp = fmap.cas["0x946dae0300630bfe"]
    assert sharp.is_aggregation_node
    assert fmap.cas["0xb83fd20300da1138"].description == "worker20 mlx5_3"
    assert fmap.switches["0x0002c9020040f160"].lid == 478
    assert {link.speed for link in fmap.links} == {"HDR"}
    assert all(link.gbps == 200.0 for link in fmap.links)
    # The excerpt lists the SHARP node's one port against two switches; both
    # cables are kept, and the oddity is said in words.
    assert len(fmap.links) == 3
    assert len(fmap.warnings) == 1
    assert "0x946dae0300630bfe" in fmap.warnings[0]
    assert "two runs" in fmap.warnings[0]


def test_hdr_capture_has_no_trailing_newline_and_still_reads_its_last_line() -> None:
    text = read(HDR_PORTS)
    fmap = parse(text.rstrip("\n"))
    assert "0x0002c9020040f160" in fmap.switches


@pytest.mark.parametrize("name", CAPTURES)
def test_windows_line_endings_and_bytes_read_the_same(name: str) -> None:
    text = read(name)
    plain = parse(text)
    assert parse(text.replace("\n", "\r\n")) == plain
    assert parse(text.encode()) == plain


# --- GUIDs and speeds ----------------------------------------------------------------


@pytest.mark.parametrize(
    "spelling",
    ["0x58a2e10300a7820e", "58a2e10300a7820e", "58a2:e103:00a7:820e", "0X58A2E10300A7820E", "H-58a2e10300a7820e"],
)
def test_guid_spellings_are_one(spelling: str) -> None:
    assert normalize_guid(spelling) == "0x58a2e10300a7820e"


def test_guids_from_ibstat_capture_normalize() -> None:
    guids = re.findall(r"Node GUID: (\S+)", read("ibstat_h100-node_cx7-400g_all-active.txt"))
    assert guids
    assert all(normalize_guid(g) == g.lower() for g in guids)


@pytest.mark.parametrize("text", [None, "", "  ", "0x0", "0000:0000:0000:0000", "not-a-guid", "0x" + "f" * 17])
def test_guid_absent_or_zero_is_none(text: str | None) -> None:
    assert normalize_guid(text) is None


def test_short_guid_is_zero_padded() -> None:
    assert normalize_guid("0x2c9") == "0x00000000000002c9"


def test_lane_rates() -> None:
    assert lane_gbps("NDR") == 100.0
    assert lane_gbps("fdr10") == 10.0
    assert lane_gbps("???") is None


# --- the default format's other spellings --------------------------------------------

NAME_MAPPED = """\
# Topology file: generated with a node-name map
vendid=0x2c9
devid=0xd2f2
sysimgguid=0x1000000000000001
switchguid=0x1000000000000001(1000000000000001)
Switch\t3 "leaf-a"\t\t# "leaf-a:MQM9700" enhanced port 0 lid 10 lmc 0
[1]\t"gpu-1 mlx5_0"[1](2000000000000001) \t\t# "gpu-1 mlx5_0" lid 20 4xNDR
[2]\t"spine-a"[7]\t\t# "spine-a:MQM9700" lid 11 4xNDR

switchguid=0x1000000000000002(1000000000000002)
Switch\t8 "spine-a"\t\t# "spine-a:MQM9700" base port 0 lid 11 lmc 0
[7]\t"leaf-a"[2]\t\t# "leaf-a:MQM9700" lid 10 4xNDR

caguid=0x2000000000000001
Ca\t2 "gpu-1 mlx5_0"\t\t# "gpu-1 mlx5_0"
[1](2000000000000001) \t"leaf-a"[1]\t\t# lid 20 lmc 0 "leaf-a:MQM9700" lid 10 4xNDR
"""


def test_names_from_a_node_name_map_resolve_through_the_headers() -> None:
    fmap = parse(NAME_MAPPED)
    assert set(fmap.switches) == {"0x1000000000000001", "0x1000000000000002"}
    assert fmap.switches["0x1000000000000002"].lid == 11  # a "base" switch port 0
    assert fmap.cas["0x2000000000000001"].lid == 20
    assert {frozenset(link.ends()) for link in fmap.links} == {
        frozenset({("0x1000000000000001", 1), ("0x2000000000000001", 1)}),
        frozenset({("0x1000000000000001", 2), ("0x1000000000000002", 7)}),
    }
    assert fmap.warnings == []


def test_a_peer_without_a_block_is_kept_from_the_port_line() -> None:
    cut = NAME_MAPPED.split("switchguid=0x1000000000000002")[0]
    cut += '[3]\t"H-3000000000000003"[1](3000000000000003) \t\t# "gpu-3 mlx5_0" lid 30 4xHDR\n'
    fmap = parse(cut)
    assert fmap.cas["0x3000000000000003"].description == "gpu-3 mlx5_0"
    assert fmap.cas["0x3000000000000003"].lid == 30
    assert any("no block of its own" in w for w in fmap.warnings)
    # "spine-a" and "gpu-1 mlx5_0" were never described and carry no GUID in
    # their names: their cables are left out, and that is said.
    assert any('"spine-a"' in w and "left out" in w for w in fmap.warnings)
    assert any('"gpu-1 mlx5_0"' in w and "left out" in w for w in fmap.warnings)
    assert [frozenset(link.ends()) for link in fmap.links] == [
        frozenset({("0x1000000000000001", 3), ("0x3000000000000003", 1)})
    ]


# --- refusals ---------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["", "\n\n", "   \n", "#\n# Topology file: generated on Fri\n#\n"])
def test_empty_scan_is_refused_in_words(text: str) -> None:
    with pytest.raises(TopologyParseError, match="empty"):
        parse(text)


def test_settings_alone_are_no_fabric() -> None:
    with pytest.raises(TopologyParseError, match="no switch and no adapter"):
        parse("vendid=0x2c9\ndevid=0x1021\n")


def test_garbage_names_its_line() -> None:
    lines = [*read(ISOLATED).splitlines(), "ibwarn: [12345] mad_rpc_open_port: can't open UMAD port"]
    with pytest.raises(TopologyParseError) as caught:
        parse("\n".join(lines))
    assert caught.value.line == len(lines) == 11
    assert str(caught.value).startswith("line 11: ")
    assert "not ibnetdiscover output" in str(caught.value)
    assert isinstance(caught.value, ValueError)


def test_an_error_message_instead_of_a_scan() -> None:
    with pytest.raises(TopologyParseError, match="line 1"):
        parse("ibnetdiscover: iberror: failed: discover failed\n")


def test_port_line_before_any_node() -> None:
    with pytest.raises(TopologyParseError, match="before any Switch or Ca"):
        parse('[1]\t"H-e09d7303007a4bd8"[1](e09d7303007a4bd8) \t\t# "x" lid 647 4xNDR\n')


def test_broken_port_line() -> None:
    text = read(SUPERPOD).splitlines()[:12]
    text[11] = re.sub(r" lid \d+ 4xNDR$", "", text[11])
    with pytest.raises(TopologyParseError, match=r"line 12: .* is not a port line"):
        parse("\n".join(text))


def test_node_without_a_guid() -> None:
    with pytest.raises(TopologyParseError, match='named "leaf-a" has no GUID'):
        parse('Switch\t3 "leaf-a"\t\t# "leaf-a" enhanced port 0 lid 10 lmc 0\n')


def test_one_guid_as_two_kinds() -> None:
    text = "CA 1 1 0x0000000000000001 4x EDR - SW 2 1 0x0000000000000001 ( 'a' - 'b' )\n"
    with pytest.raises(TopologyParseError, match="line 1: GUID 0x0000000000000001 is listed both"):
        parse(text)


def test_ports_report_line_without_peer_or_name() -> None:
    with pytest.raises(TopologyParseError, match=r"line 2: .*neither a peer"):
        parse(read(EDR_PORTS).splitlines()[0] + "\nSW  1719  1 0x7cfe9003009ce5b0 4x EDR - what\n")


def test_formats_do_not_mix() -> None:
    # The isolated capture's first six lines are comments, blank, then vendid=.
    with pytest.raises(TopologyParseError, match=r"line 7: .vendid=0x2c9. is not a line of ibnetdiscover -p"):
        parse(read(EDR_PORTS).splitlines()[0] + "\n" + read(ISOLATED))


def test_huge_numbers_are_refused_not_crashed() -> None:
    with pytest.raises(TopologyParseError):
        parse(f'Switch\t{"9" * 5000} "S-2c5eab0300b87b40"\t\t# "x" enhanced port 0 lid 73 lmc 0\n')


def test_not_text_is_refused() -> None:
    with pytest.raises(TopologyParseError, match="must be text"):
        parse(42)  # type: ignore[arg-type]


# --- mangled captures: only TopologyParseError may escape ------------------------------

_SMALL = {name: read(name) for name in [ISOLATED, EDR_PORTS, HDR_PORTS]}
# The superpod's first blocks: enough of every line shape, small enough to mangle fast.
_SMALL["superpod-head"] = "\n".join(read(SUPERPOD).splitlines()[:160])
_ALPHABET = st.sampled_from([*list("[]()\"#'=-x0123456789abcdefSHCaSwitchlid \t\n"), "\x00", "é", "\r"])


def _parses_or_refuses(text: str | bytes) -> None:
    try:
        fmap = parse(text)
    except TopologyParseError as e:
        assert str(e)
        assert e.line is None or e.line >= 1
        return
    assert fmap.switches or fmap.cas or fmap.routers
    _assert_each_cable_once(fmap)
    for link in fmap.links:
        assert fmap.node(link.a_guid) is not None
        assert fmap.node(link.b_guid) is not None


@settings(max_examples=150, deadline=None)
@given(st.text())
def test_any_text_parses_or_is_refused(text: str) -> None:
    _parses_or_refuses(text)


@settings(max_examples=150, deadline=None)
@given(st.binary())
def test_any_bytes_parse_or_are_refused(data: bytes) -> None:
    _parses_or_refuses(data)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    name=st.sampled_from(sorted(_SMALL)),
    cut=st.integers(min_value=0, max_value=20_000),
    edits=st.lists(st.tuples(st.integers(min_value=0, max_value=20_000), st.text(_ALPHABET, max_size=8)), max_size=6),
)
def test_mangled_captures_parse_or_are_refused(name: str, cut: int, edits: list[tuple[int, str]]) -> None:
    text = _SMALL[name]
    text = text[: cut % (len(text) + 1)]
    for at, insert in edits:
        at %= len(text) + 1
        text = text[:at] + insert + text[at + len(insert) :]
    _parses_or_refuses(text)


@settings(max_examples=150, deadline=None)
@given(name=st.sampled_from(sorted(_SMALL)), data=st.data())
def test_lines_dropped_or_shuffled_parse_or_are_refused(name: str, data: st.DataObject) -> None:
    lines = _SMALL[name].splitlines()
    kept = data.draw(st.lists(st.sampled_from(lines), max_size=len(lines)))
    _parses_or_refuses("\n".join(kept))
