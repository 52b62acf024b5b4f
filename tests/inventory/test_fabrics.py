"""The fabric analysis, on hand-built inventories that tell one story each."""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime, timedelta

from hypothesis import example, given, settings
from hypothesis import strategies as st

from inventory.fabrics import (
    ERROR_COUNTERS,
    FabricReport,
    PortFacts,
    PortLink,
    PortName,
    PortPlace,
    SMChange,
    analyze,
    describe_key,
    fabric_id,
    fabric_kind,
    node_fabric_keys,
    node_fabric_labels,
    physical_ports,
    sm_report,
)

NORTH_SM = "0x248a0703005d1b01"
SOUTH_SM = "0x248a0703005d2c02"
STANDBY_SM = "0x248a0703005d1b99"
NOW = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
KINDS = {
    "split_name",
    "merged_names",
    "split_node",
    "sm_unknown",
    "sm_flapping",
    "port_down",
    "slow_port",
    "errors_rising",
}


def port(node: str, hca: str = "mlx5_0", **kw: object) -> PortFacts:
    """An active 400G InfiniBand port on north's SM unless told otherwise."""
    facts: dict[str, object] = {
        "state": "4: ACTIVE",
        "phys_state": "5: LinkUp",
        "rate_gbps": 400.0,
        "link_layer": "InfiniBand",
        "sm_lid": 1,
        "sm_guid": NORTH_SM,
        "declared_fabric": "north",
    }
    facts.update(kw)
    return PortFacts(node=node, hca=hca, port=1, **facts)  # type: ignore[arg-type]


def node(name: str, hcas: int = 4, **kw: object) -> list[PortFacts]:
    return [port(name, f"mlx5_{i}", **kw) for i in range(hcas)]


def kinds(report: FabricReport) -> list[str]:
    return [p.kind for p in report.problems]


# --- the story: two physical fabrics, one mislabelled node ------------------------------


def two_fabrics_one_mislabelled() -> list[PortFacts]:
    """Six nodes on north, six on south; south-06 says 'south' but is cabled into north."""
    ports: list[PortFacts] = []
    for i in range(1, 7):
        ports += node(f"north-{i:02}")
    for i in range(1, 6):
        ports += node(f"south-{i:02}", sm_guid=SOUTH_SM, sm_lid=7, declared_fabric="south")
    ports += node("south-06", sm_guid=NORTH_SM, sm_lid=1, declared_fabric="south")
    return ports


def test_the_analysis_names_the_mislabelled_node() -> None:
    report = analyze(two_fabrics_one_mislabelled(), [], NOW)
    assert [p.key for p in report.physical] == [f"sm:{NORTH_SM}", f"sm:{SOUTH_SM}"]
    north, south = report.physical
    assert north.declared == ["north", "south"]  # most used first
    assert north.label == "north / south"
    assert north.nodes == [f"north-{i:02}" for i in range(1, 7)] + ["south-06"]
    assert south.declared == ["south"]
    assert (south.sm_guid, south.sm_lid, south.rate_gbps) == (SOUTH_SM, 7, 400.0)

    naming = [p for p in report.problems if p.kind in ("split_name", "merged_names")]
    assert {p.node for p in naming} == {"south-06"}
    split = next(p for p in naming if p.kind == "split_name")
    assert split.fabric == "south"
    assert split.physical == f"sm:{NORTH_SM}"
    assert "south-06 is likely mislabelled" in split.message
    assert "which the other nodes there call 'north'" in split.message
    assert "5 nodes on SM 0x248a0703005d2c02 (LID 7)" in split.message
    merged = next(p for p in naming if p.kind == "merged_names")
    assert merged.fabric == "south"
    assert "south-06 is likely mislabelled 'south' where its peers say 'north'" in merged.message
    # Nothing else is wrong with this fleet.
    assert sorted(kinds(report)) == ["merged_names", "split_name"]


def test_placement_sees_the_physical_truth() -> None:
    report = analyze(two_fabrics_one_mislabelled(), [], NOW)
    assert report.fabric_of("south-06") == f"sm:{NORTH_SM}"
    assert report.fabric_of("north-01") == f"sm:{NORTH_SM}"
    assert report.fabric_of("south-01") == f"sm:{SOUTH_SM}"
    assert report.why_no_fabric("south-01") is None
    assert report.fabric_of("nobody") is None
    assert report.why_no_fabric("nobody") == "nobody reported no InfiniBand or RoCE port"


def test_a_node_mislabelled_on_one_side_and_alone_on_the_other() -> None:
    """One node on each side: the tie is broken by the fabric that carries another name."""
    ports = node("north-01") + node("north-02") + node("south-01", sm_guid=SOUTH_SM, declared_fabric="south")
    ports += node("south-02", declared_fabric="south")  # on north's SM
    report = analyze(ports, [], NOW)
    named = {(p.kind, p.node) for p in report.problems}
    assert named == {("split_name", "south-02"), ("merged_names", "south-02")}


# --- naming problems on their own ------------------------------------------------------


def test_a_name_split_evenly_cannot_say_who_is_wrong() -> None:
    ports = node("a", declared_fabric="x") + node("b", sm_guid=SOUTH_SM, declared_fabric="x")
    report = analyze(ports, [], NOW)
    (problem,) = report.problems
    assert problem.kind == "split_name"
    assert problem.node is None
    assert "nothing to tell which is right" in problem.message
    assert "SM 0x248a0703005d1b01 (LID 1): a" in problem.message


def test_two_names_evenly_on_one_fabric() -> None:
    ports = node("a", declared_fabric="left") + node("b", declared_fabric="right")
    report = analyze(ports, [], NOW)
    (problem,) = report.problems
    assert problem.kind == "merged_names"
    assert problem.node is None
    assert problem.physical == f"sm:{NORTH_SM}"
    assert "'left' (a) and 'right' (b), in equal measure" in problem.message


def test_undeclared_ports_are_grouped_but_not_judged() -> None:
    report = analyze(node("a", declared_fabric=None) + node("b", declared_fabric=""), [], NOW)
    (fabric,) = report.physical
    assert fabric.declared == []
    assert fabric.label == "SM 0x248a0703005d1b01 (LID 1)"
    assert report.problems == []


def test_one_name_on_two_fabrics_gets_labels_that_tell_them_apart() -> None:
    ports = node("a", declared_fabric="x") + node("b", declared_fabric="x")
    ports += node("c", sm_guid=SOUTH_SM, sm_lid=9, declared_fabric="x")
    report = analyze(ports, [], NOW)
    assert sorted(p.label for p in report.physical) == [
        "x (SM 0x248a0703005d1b01 (LID 1))",
        "x (SM 0x248a0703005d2c02 (LID 9))",
    ]
    assert [p.node for p in report.problems] == ["c"]


# --- nodes that placement must keep off ----------------------------------------------------


def test_a_node_on_two_fabrics_is_reported_and_kept_off() -> None:
    ports = node("a", 2) + node("b", 2, sm_guid=SOUTH_SM, declared_fabric="south")
    ports += [port("c", "mlx5_0"), port("c", "mlx5_1", sm_guid=SOUTH_SM, declared_fabric="south")]
    report = analyze(ports, [], NOW)
    assert report.fabric_of("c") is None
    assert "on two physical fabrics" in (report.why_no_fabric("c") or "")
    (problem,) = report.problems_for(node="c")
    assert problem.kind == "split_node"
    assert "mlx5_0/1 on north" in problem.message
    assert "mlx5_1/1 on south" in problem.message


def test_an_unreadable_sm_is_reported_with_why() -> None:
    ports = [*node("a"), port("b", "mlx5_0"), port("b", "mlx5_1", sm_guid="", sm_error="umad: permission denied")]
    report = analyze(ports, [], NOW)
    (problem,) = report.problems
    assert (problem.kind, problem.node, problem.hca, problem.port) == ("sm_unknown", "b", "mlx5_1", 1)
    assert "umad: permission denied" in problem.message
    assert problem.fabric == "north"
    assert problem.physical is None
    assert report.fabric_of("b") is None
    assert "mlx5_1 port 1 is unknown" in (report.why_no_fabric("b") or "")


def test_an_unknown_sm_without_a_reason_says_so() -> None:
    report = analyze([port("a", sm_guid=None, sm_lid=None)], [], NOW)
    assert "no reason was given" in report.problems[0].message


def test_a_zero_sm_guid_is_unknown() -> None:
    report = analyze([port("a", sm_guid="0x0000000000000000", sm_error="no SM answered")], [], NOW)
    assert kinds(report) == ["sm_unknown"]
    assert report.physical == []


def test_guid_spellings_are_one_fabric() -> None:
    ports = [port("a", sm_guid="248a:0703:005d:1b01"), port("b", sm_guid="0X248A0703005D1B01")]
    report = analyze(ports, [], NOW)
    assert [p.key for p in report.physical] == [f"sm:{NORTH_SM}"]


def test_roce_ports_group_by_network() -> None:
    roce = {"link_layer": "Ethernet", "sm_guid": None, "sm_lid": None, "declared_fabric": "eth"}
    ports = [port("a", network="10.10.0.0/16", **roce), port("b", network="10.10.0.0/16", **roce)]
    ports.append(port("c", network=None, **roce))
    report = analyze(ports, [], NOW)
    (fabric,) = report.physical
    assert (fabric.key, fabric.kind, fabric.network, fabric.sm_guid) == (
        "roce:10.10.0.0/16",
        "roce",
        "10.10.0.0/16",
        None,
    )
    assert fabric.id == "roce-10.10.0.0_16"
    assert report.fabric("roce-10.10.0.0_16") is fabric
    (problem,) = report.problems
    assert problem.kind == "sm_unknown"
    assert "RoCE but its network was not reported" in problem.message


# --- ports down, slow ---------------------------------------------------------------------


def test_a_port_down_says_what_to_check() -> None:
    ports = [*node("a"), port("b", state="1: DOWN", phys_state="2: Polling", sm_guid=None, rate_gbps=None)]
    report = analyze(ports, [], NOW)
    (problem,) = report.problems
    assert problem.kind == "port_down"  # and not sm_unknown: a down port has no SM to read
    assert "state 1: DOWN, physical state 2: Polling" in problem.message
    assert "no link partner" in problem.message
    assert report.fabric_of("b") is None
    assert report.why_no_fabric("b") == "every InfiniBand/RoCE port of b is down"


def test_down_hints_follow_the_physical_state() -> None:
    report = analyze(
        [
            port("a", "mlx5_0", state="DOWN", phys_state="3: Disabled"),
            port("a", "mlx5_1", state="2: INIT", phys_state="5: LinkUp"),
            port("a", "mlx5_2", state="Down", phys_state=None),
        ],
        [],
        NOW,
    )
    messages = [p.message for p in report.problems]
    assert "disabled" in messages[0]
    assert "is an SM running" in messages[1]
    assert "(state Down)" in messages[2]


def test_a_node_with_one_port_down_keeps_its_fabric() -> None:
    report = analyze([*node("a", 3), port("a", "mlx5_9", state="DOWN")], [], NOW)
    assert report.fabric_of("a") == f"sm:{NORTH_SM}"
    assert kinds(report) == ["port_down"]


def test_an_unreported_state_is_not_down() -> None:
    report = analyze([port("a", state=None), port("b", state="")], [], NOW)
    assert report.problems == []
    assert report.fabric_of("a") == f"sm:{NORTH_SM}"


def test_a_slow_port_is_compared_with_its_fabrics_peers() -> None:
    ports = node("a") + node("b") + [port("c", rate_gbps=200.0)]
    ports += node("s", sm_guid=SOUTH_SM, rate_gbps=200.0, declared_fabric="south")  # another fabric, its own rate
    report = analyze(ports, [], NOW)
    (problem,) = report.problems
    assert (problem.kind, problem.node) == ("slow_port", "c")
    assert "runs at 200 Gb/s where 8 ports on north run at 400 Gb/s" in problem.message


def test_rates_unknown_are_not_slow() -> None:
    assert analyze([port("a", rate_gbps=None), port("b")], [], NOW).problems == []


# --- error counters ---------------------------------------------------------------------------


def test_rising_error_counters_are_reported_with_their_rise() -> None:
    before = {"symbol_error": 3, "link_downed": 1, "port_xmit_data": 10, "port_rcv_packets": 5}
    after = {"symbol_error": 15, "link_downed": 2, "port_xmit_data": 10**12, "port_rcv_packets": 10**9}
    report = analyze([port("a", counters=after, previous_counters=before)], [], NOW)
    (problem,) = report.problems
    assert problem.kind == "errors_rising"
    assert "symbol errors +12, link downs +1 since the previous report" in problem.message
    assert "cable or transceiver" in problem.message
    assert "xmit" not in problem.message and "packets" not in problem.message


def test_traffic_alone_is_never_an_error() -> None:
    before = {"port_xmit_data": 1, "port_rcv_data": 1, "port_xmit_packets": 1, "port_xmit_wait": 0, "VL15_dropped": 0}
    after = {
        "port_xmit_data": 9**20,
        "port_rcv_data": 9**9,
        "port_xmit_packets": 9,
        "port_xmit_wait": 99,
        "VL15_dropped": 4,
    }
    assert analyze([port("a", counters=after, previous_counters=before)], [], NOW).problems == []


def test_a_first_report_has_nothing_to_compare() -> None:
    assert analyze([port("a", counters={"symbol_error": 500}, previous_counters=None)], [], NOW).problems == []


def test_a_reset_counter_counts_at_least_what_it_shows() -> None:
    report = analyze([port("a", counters={"symbol_error": 4}, previous_counters={"symbol_error": 90})], [], NOW)
    assert "symbol errors +4 (at least; the counter was reset)" in report.problems[0].message
    reset_to_zero = analyze([port("a", counters={"symbol_error": 0}, previous_counters={"symbol_error": 9})], [], NOW)
    assert reset_to_zero.problems == []


def test_perfquery_names_and_congestion_advice() -> None:
    report = analyze(
        [port("a", counters={"PortXmitDiscards": "7", "bogus": "x"}, previous_counters={"PortXmitDiscards": 2})],
        [],
        NOW,
    )
    assert "transmit discards +5" in report.problems[0].message
    assert "congestion" in report.problems[0].message


def test_every_error_counter_rising_is_caught() -> None:
    before = dict.fromkeys(ERROR_COUNTERS, 0)
    after = dict.fromkeys(ERROR_COUNTERS, 1)
    (problem,) = analyze([port("a", counters=after, previous_counters=before)], [], NOW).problems
    assert all(f"{words} +1" in problem.message for words in ERROR_COUNTERS.values())


def test_counters_on_a_down_port_still_count() -> None:
    ports = [port("a", state="DOWN", counters={"link_downed": 5}, previous_counters={"link_downed": 4})]
    assert sorted(kinds(analyze(ports, [], NOW))) == ["errors_rising", "port_down"]


# --- the subnet manager's history ----------------------------------------------------------


def failover(at: datetime, old: str | None, new: str | None, nodes: int = 3) -> list[SMChange]:
    """Every port of the fabric sees the change, each at its next report."""
    return [SMChange(f"north-{i}", "mlx5_0", 1, old, new, at + timedelta(seconds=20 * i)) for i in range(nodes)]


def test_one_failover_is_kept_with_its_time() -> None:
    changes = failover(NOW - timedelta(hours=3), STANDBY_SM, NORTH_SM)
    report = analyze(node("north-0"), changes, NOW)
    (fabric,) = report.physical
    (event,) = fabric.sms
    assert (event.old, event.new, event.kind, event.ports) == (STANDBY_SM, NORTH_SM, "changed", 3)
    assert event.nodes == ["north-0", "north-1", "north-2"]
    (problem,) = report.problems
    assert problem.kind == "sm_flapping"
    assert problem.physical == f"sm:{NORTH_SM}"
    assert "changed once in the last 24 hours, last at 2026-03-02 09:00:00 UTC" in problem.message
    assert "a failover" in problem.message


def test_changes_within_the_hour_are_flapping() -> None:
    changes = failover(NOW - timedelta(minutes=50), NORTH_SM, STANDBY_SM)
    changes += failover(NOW - timedelta(minutes=30), STANDBY_SM, NORTH_SM)
    changes += failover(NOW - timedelta(minutes=10), NORTH_SM, None)
    changes += failover(NOW - timedelta(minutes=9), None, NORTH_SM)
    report = analyze(node("north-0"), changes, NOW)
    (problem,) = report.problems
    assert problem.kind == "sm_flapping"
    assert "changed 4 times in the last hour" in problem.message
    assert "it is flapping" in problem.message
    assert "at 2026-03-02 11:10:00 UTC from 0x248a0703005d1b01 to 0x248a0703005d1b99" in problem.message
    assert "from 0x248a0703005d1b01 to none" in problem.message
    assert len(report.physical[0].sms) == 4


def test_old_changes_are_history_not_problems() -> None:
    report = analyze(node("north-0"), failover(NOW - timedelta(days=3), STANDBY_SM, NORTH_SM), NOW)
    assert report.problems == []
    assert len(report.physical[0].sms) == 1


def test_ports_moving_between_fabrics_are_not_an_sm_change() -> None:
    ports = node("north-0") + node("south-0", sm_guid=SOUTH_SM, declared_fabric="south")
    moved = [SMChange("x", "mlx5_0", 1, SOUTH_SM, NORTH_SM, NOW - timedelta(minutes=m)) for m in (5, 30)]
    report = analyze(ports, moved, NOW)
    assert report.problems == []
    assert {e.kind for e in report.physical[0].sms} == {"moved"}


def test_naive_times_are_utc() -> None:
    naive = NOW.replace(tzinfo=None)
    report = analyze(node("north-0"), failover(naive - timedelta(hours=1), STANDBY_SM, NORTH_SM), naive)
    assert "at 2026-03-02 11:00:00 UTC" in report.problems[0].message


def test_changes_of_fabrics_nobody_is_on_are_ignored() -> None:
    assert analyze(node("north-0"), failover(NOW, "0x77", "0x78"), NOW).problems == []


# --- keys, ids, JSON ---------------------------------------------------------------------------


def test_fabric_ids_are_url_safe() -> None:
    assert fabric_id(f"sm:{NORTH_SM}") == "sm-0x248a0703005d1b01"
    assert fabric_id("roce:10.0.0.0/24") == "roce-10.0.0.0_24"
    assert fabric_id("roce:fd00::/64") == "roce-fd00--_64"
    assert fabric_id("roce:weird name?#") == "roce-weird_name__"


def test_describe_key() -> None:
    assert describe_key(f"sm:{NORTH_SM}", 1) == "SM 0x248a0703005d1b01 (LID 1)"
    assert describe_key(f"sm:{NORTH_SM}") == "SM 0x248a0703005d1b01"
    assert describe_key("roce:10.0.0.0/24") == "RoCE 10.0.0.0/24"


def test_report_as_json() -> None:
    report = analyze(two_fabrics_one_mislabelled(), failover(NOW, STANDBY_SM, NORTH_SM), NOW)
    data = json.loads(json.dumps(report.as_json()))
    assert data["physical"][0]["id"] == "sm-0x248a0703005d1b01"
    assert data["physical"][0]["sms"][0]["at"] == "2026-03-02T12:00:00+00:00"
    assert data["nodes"]["south-06"] == {"fabric": f"sm:{NORTH_SM}", "why_not": None}
    assert {p["kind"] for p in data["problems"]} == {"split_name", "merged_names", "sm_flapping"}


# --- any inventory: the analysis holds together ------------------------------------------------

_ports = st.builds(
    PortFacts,
    node=st.sampled_from(["a", "b", "c", "d", "e"]),
    hca=st.sampled_from(["mlx5_0", "mlx5_1", "mlx5_2"]),
    port=st.sampled_from([1, 2]),
    state=st.sampled_from([None, "", "4: ACTIVE", "1: DOWN", "2: INIT", "Active"]),
    phys_state=st.sampled_from([None, "5: LinkUp", "2: Polling", "3: Disabled"]),
    rate_gbps=st.sampled_from([None, 100.0, 200.0, 400.0]),
    link_layer=st.sampled_from([None, "InfiniBand", "Ethernet"]),
    sm_lid=st.sampled_from([None, 0, 1, 7]),
    sm_guid=st.sampled_from([None, "", NORTH_SM, SOUTH_SM, "248a:0703:005d:2c02", "garbage", "0x0"]),
    sm_error=st.sampled_from([None, "", "timeout"]),
    network=st.sampled_from([None, "", "10.0.0.0/24", "fd00::/64"]),
    declared_fabric=st.sampled_from([None, "", "north", "south", "east"]),
    counters=st.one_of(
        st.none(),
        st.dictionaries(
            st.sampled_from(["symbol_error", "port_xmit_data", "LinkDownedCounter", "x"]),
            st.one_of(st.integers(-5, 2**70), st.text(max_size=3)),
        ),
    ),
    previous_counters=st.one_of(
        st.none(),
        st.dictionaries(
            st.sampled_from(["symbol_error", "port_xmit_data", "LinkDownedCounter"]), st.integers(0, 2**64)
        ),
    ),
)
_changes = st.builds(
    SMChange,
    node=st.sampled_from(["a", "b"]),
    hca=st.just("mlx5_0"),
    port=st.just(1),
    old=st.sampled_from([None, NORTH_SM, SOUTH_SM, STANDBY_SM]),
    new=st.sampled_from([None, NORTH_SM, SOUTH_SM, STANDBY_SM]),
    at=st.datetimes(min_value=datetime(2026, 3, 1), max_value=datetime(2026, 3, 3)),
)


@settings(max_examples=150, deadline=None)
@given(ports=st.lists(_ports, max_size=25), changes=st.lists(_changes, max_size=8))
def test_any_inventory_gives_a_coherent_report(ports: list[PortFacts], changes: list[SMChange]) -> None:
    report = analyze(ports, changes, NOW)
    keys = [p.key for p in report.physical]
    assert len(keys) == len(set(keys))
    assert len({p.label for p in report.physical}) == len(keys)
    for problem in report.problems:
        assert problem.kind in KINDS
        assert problem.message.endswith(".")
        assert problem.physical is None or problem.physical in keys
    for name in {p.node for p in ports}:
        key = report.fabric_of(name)
        assert (key is None) != (report.why_no_fabric(name) is None)
        assert key is None or key in keys
    # Each port is counted in at most one physical fabric.
    refs = [ref for p in report.physical for ref in p.ports]
    assert len(refs) == len(set(refs)) or len(ports) != len({(p.node, p.hca, p.port) for p in ports})
    json.dumps(report.as_json())


@settings(max_examples=300, deadline=None)
@given(ports=st.lists(_ports, max_size=25))
def test_the_nodes_fabrics_alone_are_the_whole_analysis_answer(ports: list[PortFacts]) -> None:
    """Placement reads only what decides a node's fabric: the answer is fabric_of's, node for node."""
    report = analyze(ports, [], NOW)
    want = {n: k for n in {p.node for p in ports} if (k := report.fabric_of(n)) is not None}
    links = [PortLink.of(p) for p in ports]
    assert node_fabric_keys(links) == want
    assert node_fabric_keys(links + links[::-1]) == want, "a port read twice changes nothing"


@settings(max_examples=300, deadline=None)
@given(ports=st.lists(_ports, max_size=25))
def test_the_fabrics_ports_alone_are_the_whole_analysis_answer(ports: list[PortFacts]) -> None:
    """The scan planner reads only each physical fabric's key, kind and ports: the analysis' own."""
    report = analyze(ports, [], NOW)
    got = physical_ports(PortPlace.of(p) for p in ports)
    assert got == {f.key: f.ports for f in report.physical}
    assert all(fabric_kind(f.key) == f.kind for f in report.physical)


@settings(max_examples=300, deadline=None)
@given(ports=st.lists(_ports, max_size=25))
# Unnamed, so labelled by its SM at the LID most ports reach it at: 1 (a's two), though as many nodes do at 7.
@example(ports=[*node("a", 2, declared_fabric=None), port("b", sm_lid=7, declared_fabric=None)])
def test_the_nodes_fabric_labels_alone_are_the_whole_analysis_answer(ports: list[PortFacts]) -> None:
    """The reachability sweep reads only what names a node's fabric: the label is the analysis', node for node."""
    report = analyze(ports, [], NOW)
    want = {n: report.fabric(k).label for n in {p.node for p in ports} if (k := report.fabric_of(n)) is not None}
    rows = [PortName.of(p) for p in ports]
    assert node_fabric_labels(rows) == want
    # As the database reads them: alike ports of a node as one row, with how many they are.
    grouped = Counter(rows)
    assert node_fabric_labels([row._replace(ports=n) for row, n in grouped.items()]) == want


@settings(max_examples=300, deadline=None)
@given(ports=st.lists(_ports, max_size=25), changes=st.lists(_changes, max_size=8))
def test_the_sm_report_is_the_whole_analysis_answer_where_the_sweep_reads_it(
    ports: list[PortFacts], changes: list[SMChange]
) -> None:
    """The doctor sweep reads each node's fabric, the fabrics' names and SM histories, and the SM problems."""
    full = analyze(ports, changes, NOW)
    rows = [PortName.of(p) for p in ports]
    for lean in (
        sm_report(rows, changes, NOW),
        sm_report([r._replace(ports=n) for r, n in Counter(rows).items()], changes, NOW),
    ):
        assert {n: lean.fabric_of(n) for n in {p.node for p in ports}} == {
            n: full.fabric_of(n) for n in {p.node for p in ports}
        }
        assert lean.problems == [p for p in full.problems if p.kind == "sm_flapping"]
        assert [p.key for p in lean.physical] == [p.key for p in full.physical]
        for ph in lean.physical:
            whole = full.fabric(ph.key)
            assert (ph.label, ph.declared, ph.sm_guid, ph.sm_lid, ph.sms) == (
                whole.label,
                whole.declared,
                whole.sm_guid,
                whole.sm_lid,
                whole.sms,
            )


def test_the_nodes_fabrics_alone_on_the_stories() -> None:
    ports = [*node("a"), *node("b", sm_guid=SOUTH_SM), port("b", "mlx5_9"), *node("c", state="1: DOWN")]
    ports += [port("d", sm_guid="", sm_error="timeout"), port("d", "mlx5_1"), port("e", state=None)]
    ports += [port("f", link_layer="Ethernet", network="10.0.0.0/24"), port("g", link_layer="Ethernet")]
    ports += [port("h", sm_guid="0x0"), port("i", "mlx5_0", state="1: DOWN"), port("i", "mlx5_1")]
    got = node_fabric_keys(PortLink.of(p) for p in ports)
    assert got == {"a": f"sm:{NORTH_SM}", "e": f"sm:{NORTH_SM}", "f": "roce:10.0.0.0/24", "i": f"sm:{NORTH_SM}"}


def test_the_report_digest_keeps_exactly_the_error_counters_the_analysis_reads():
    from agent import protocol
    from inventory.fabrics.facts import _PERFQUERY_NAMES

    assert list(ERROR_COUNTERS) == list(protocol.ERROR_COUNTERS), "the analysis's counters are the agent's list"
    spellings = {**{name: 1 for name in ERROR_COUNTERS}, **{name: 1 for name in _PERFQUERY_NAMES}}
    assert protocol.error_counters({**spellings, "port_xmit_data": 1, "VL15_dropped": 1}) == spellings
