"""InfiniBand/RoCE ports: the ibstat/ibstatus captures, a fake sysfs, sminfo and RoCE networks."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.discovery import infiniband as ib
from agent.discovery.errors import DiscoveryError
from agent.discovery.sources import Sources
from agent.discovery.tools import ToolOutput
from tests.captures import capture, read

H100 = "ibstat_h100-node_cx7-400g_all-active.txt"
A100 = "ibstat_a100-node_cx6-200g_ib-and-eth.txt"
PANIC = "ibstat_a100-azure_ibpanic-exit255.txt"
IBSTATUS = "ibstatus_a100-azure_8x-hdr200.txt"
# The line infiniband-diags' sminfo prints; no real capture of it was available.
SMINFO = "sminfo: sm lid 1 sm guid 0x248a0703005c3440, activity count 5521 priority 15 state 3 SMINFO_MASTER\n"


# --- the captures ---------------------------------------------------------------------------------------------------


def test_h100_cx7_eight_ndr_ib_ports_and_one_ethernet_bond():
    ports, problems = ib.parse_ib_text(read(H100))
    assert problems == []
    assert len(ports) == 9
    infiniband = [p for p in ports if p["link_layer"] == "InfiniBand"]
    assert [p["hca"] for p in infiniband] == [f"mlx5_{n}" for n in (0, 1, 4, 5, 6, 7, 8, 9)]
    assert {p["rate_gbps"] for p in infiniband} == {400.0}
    assert {(p["state"], p["phys_state"]) for p in ports} == {("ACTIVE", "LinkUp")}
    assert {p["sm_lid"] for p in infiniband} == {1}
    assert ports[0]["lid"] == 128
    assert ports[0]["node_guid"] == ports[0]["port_guid"] == "0x58a2e10300a7820e"
    assert ports[0]["ca_type"] == "MT4129"
    bond = ports[-1]
    assert bond["hca"] == "mlx5_bond_0"
    assert bond["link_layer"] == "Ethernet"
    assert bond["rate_gbps"] == 200.0
    assert "lid" not in bond and "sm_lid" not in bond  # meaningless on RoCE, so not reported


def test_a100_cx6_one_ethernet_and_eight_hdr_ib_ports():
    ports, problems = ib.parse_ib_text(read(A100))  # this capture has no final newline
    assert problems == []
    assert len(ports) == 9
    assert [p["link_layer"] for p in ports] == ["Ethernet"] + ["InfiniBand"] * 8
    assert {p["rate_gbps"] for p in ports} == {200.0}
    assert {p["sm_lid"] for p in ports[1:]} == {83}
    assert ports[-1]["lid"] == 1396
    assert ports[0]["port_guid"] == "0x1c918efffe7a03a0"


def test_ibpanic_keeps_the_eight_ports_printed_and_says_what_failed():
    ports, problems = ib.parse_ib_text(read(PANIC))
    assert [p["hca"] for p in ports] == [f"mlx5_{n}" for n in range(8)]
    assert {p["rate_gbps"] for p in ports} == {200.0}
    assert {p["state"] for p in ports} == {"ACTIVE"}
    assert len(problems) == 1
    assert "after 8 adapters" in problems[0]
    assert "'mlx5_8' failed" in problems[0]


def test_ibstatus_eight_hdr_200_ports_and_one_ethernet():
    ports, problems = ib.parse_ib_text(read(IBSTATUS))
    assert problems == []
    assert len(ports) == 9
    hdr = ports[:8]
    assert all(p["rate_gbps"] == 200.0 and p["link_layer"] == "InfiniBand" for p in hdr)
    assert {(p["state"], p["phys_state"]) for p in ports} == {("ACTIVE", "LinkUp")}
    assert hdr[0]["lid"] == 0x33BF
    eth = ports[8]
    assert eth == {
        "hca": "mlx5_8",
        "port": 1,
        "state": "ACTIVE",
        "phys_state": "LinkUp",
        "rate_gbps": 40.0,
        "link_layer": "Ethernet",
    }


def test_ibstatus_and_ibstat_of_the_same_azure_vm_agree():
    """Both captures come from one A100 VM: LIDs (hex vs decimal) and port GUIDs (GID vs GUID) must match."""
    from_ibstat, _ = ib.parse_ib_text(read(PANIC))
    from_ibstatus, _ = ib.parse_ib_text(read(IBSTATUS))
    pick = ("hca", "port", "lid", "sm_lid", "port_guid", "state", "phys_state", "rate_gbps", "link_layer")
    assert [{k: p[k] for k in pick} for p in from_ibstat] == [{k: p[k] for k in pick} for p in from_ibstatus[:8]]


@pytest.mark.parametrize(
    "text",
    [
        "",
        "hello\n",
        "ibpanic: [1] main: stat of IB device 'mlx5_0' failed: No such file or directory\n",
        "CA 'mlx5_0'\n\tCA type MT4129\n",  # a line without a colon
        "CA 'mlx5_0'\n\tNode GUID: 0xzz\n\tPort 1:\n",
        "\tState: Active\nCA 'mlx5_0'\n",
        "CA 'mlx5_0'\n\tNumber of ports: 0\n",  # nothing usable
    ],
)
def test_unusable_ib_text_is_a_discovery_error(text):
    with pytest.raises(DiscoveryError):
        ib.parse_ib_text(text)


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_mangled_ib_captures_give_a_result_or_discovery_error(data):
    lines = read(data.draw(st.sampled_from([H100, A100, PANIC, IBSTATUS]))).splitlines()
    start = data.draw(st.integers(0, len(lines)))
    end = data.draw(st.integers(start, min(len(lines), start + 30)))
    noise = data.draw(st.text(max_size=60))
    with contextlib.suppress(DiscoveryError):
        ib.parse_ib_text("\n".join([*lines[:start], noise, *lines[end:]]))


@settings(max_examples=150, deadline=None)
@given(st.text())
def test_any_text_to_ib_parsers_gives_a_result_or_discovery_error(text):
    for parse in (ib.parse_ib_text, ib.parse_sminfo, ib.parse_ip_networks, ib.parse_ip_addresses):
        with contextlib.suppress(DiscoveryError):
            parse(text)


# --- small parsers --------------------------------------------------------------------------------------------------


def test_sysfs_field_forms():
    assert ib.parse_state("4: ACTIVE") == "ACTIVE"
    assert ib.parse_state("Initializing") == "INIT"
    assert ib.parse_state("1: DOWN") == "DOWN"
    assert ib.parse_phys_state("5: LinkUp") == "LinkUp"
    assert ib.parse_phys_state("3: Disabled") == "Disabled"
    assert ib.parse_rate("400 Gb/sec (4X NDR)") == 400.0
    assert ib.parse_rate("2.5 Gb/sec (1X SDR)") == 2.5
    assert ib.parse_int("0x33bf") == 13247
    assert ib.format_guid("58a2:e103:00a7:820e") == "0x58a2e10300a7820e"
    assert ib.format_guid("0x0015:5DFF") == "0x0000000000155dff"
    assert ib.guid_from_gid("fe80:0000:0000:0000:0015:5dff:fd34:11eb") == "0x00155dfffd3411eb"
    assert ib.guid_from_gid("0000:0000:0000:0000:0000:0000:0000:0000") is None
    assert ib.guid_from_gid("unknown") is None


def test_sminfo_documented_line():
    assert ib.parse_sminfo(SMINFO) == {
        "sm_lid": 1,
        "sm_guid": "0x248a0703005c3440",
        "activity_count": 5521,
        "priority": 15,
        "sm_state": 3,
        "sm_state_name": "SMINFO_MASTER",
    }


def test_sminfo_error_text_is_a_discovery_error():
    with pytest.raises(DiscoveryError):
        ib.parse_sminfo("ibwarn: [1234] mad_rpc_open_port: can't open UMAD port ((null):0)\n")


def test_ip_json_gives_the_global_network_first():
    text = json.dumps(
        [
            {
                "ifname": "eth2",
                "addr_info": [
                    {"family": "inet", "local": "169.254.3.1", "prefixlen": 16, "scope": "link"},
                    {"family": "inet", "local": "10.12.7.21", "prefixlen": 20, "scope": "global"},
                ],
            }
        ]
    )
    assert ib.parse_ip_networks(text) == ["10.12.0.0/20", "169.254.0.0/16"]
    assert ib.parse_ip_addresses(text) == ["169.254.3.1", "10.12.7.21"]
    assert ib.parse_ip_networks("[]") == []


# --- fake sysfs ------------------------------------------------------------------------------------------------------


def _port(
    sysfs: Path,
    hca: str,
    port: int,
    *,
    state="4: ACTIVE",
    link="InfiniBand",
    rate="400 Gb/sec (4X NDR)",
    lid="0x80",
    sm_lid="0x1",
    gid="fe80:0000:0000:0000:58a2:e103:00a7:820e",
    ndev: str | None = None,
) -> None:
    hca_dir = sysfs / "class" / "infiniband" / hca
    port_dir = hca_dir / "ports" / str(port)
    (port_dir / "gids").mkdir(parents=True)
    (port_dir / "counters").mkdir()
    (hca_dir / "node_guid").write_text("58a2:e103:00a7:820e\n")
    (hca_dir / "hca_type").write_text("MT4129\n")
    (hca_dir / "fw_ver").write_text("28.41.1000\n")
    files = {
        "state": state,
        "phys_state": "5: LinkUp" if state == "4: ACTIVE" else "3: Disabled",
        "rate": rate,
        "link_layer": link,
        "lid": lid,
        "sm_lid": sm_lid,
    }
    for name, value in files.items():
        (port_dir / name).write_text(value + "\n")
    (port_dir / "gids" / "0").write_text(gid + "\n")
    for name, value in {"symbol_error": "0", "link_downed": "2", "port_rcv_data": "123456789012"}.items():
        (port_dir / "counters" / name).write_text(value + "\n")
    (port_dir / "counters" / "not_a_number").write_text("N/A\n")
    if ndev:
        (port_dir / "gid_attrs" / "ndevs").mkdir(parents=True)
        (port_dir / "gid_attrs" / "ndevs" / "0").write_text(ndev + "\n")


class FakeTools:
    def __init__(self, sminfo: ToolOutput | None = None, ip: dict[str, str] | None = None):
        self.sminfo = sminfo or ToolOutput(stdout=SMINFO, exit_code=0)
        self.ip = ip or {}
        self.calls: list[list[str]] = []

    def __call__(self, argv: list[str]) -> ToolOutput:
        self.calls.append(argv)
        if argv[0] == "sminfo":
            return self.sminfo
        if argv[0] == "ip":
            dev = argv[-1]
            if dev not in self.ip:
                return ToolOutput(error=f'ip exited with status 1: Device "{dev}" does not exist.', exit_code=1)
            return ToolOutput(stdout=self.ip[dev], exit_code=0)
        return ToolOutput(error=f"{argv[0]} not found")


def _ip(dev: str, addr: str, prefix: int) -> str:
    return json.dumps([{"ifname": dev, "addr_info": [{"family": "inet", "local": addr, "prefixlen": prefix}]}])


def test_no_infiniband_class_means_no_ports_and_no_problem(tmp_path):
    tools = FakeTools()
    assert ib.collect_ib_ports(Sources(sysfs_root=tmp_path), tools) == ([], [])
    assert tools.calls == []


def test_sysfs_ib_port_with_its_subnet_manager(tmp_path):
    _port(tmp_path, "mlx5_0", 1)
    tools = FakeTools()
    ports, problems = ib.collect_ib_ports(Sources(sysfs_root=tmp_path), tools)
    assert problems == []
    assert ports == [
        {
            "hca": "mlx5_0",
            "port": 1,
            "state": "ACTIVE",
            "phys_state": "LinkUp",
            "rate_gbps": 400.0,
            "link_layer": "InfiniBand",
            "lid": 128,
            "sm_lid": 1,
            "node_guid": "0x58a2e10300a7820e",
            "port_guid": "0x58a2e10300a7820e",
            "ca_type": "MT4129",
            "firmware": "28.41.1000",
            "counters": {"link_downed": 2, "port_rcv_data": 123456789012, "symbol_error": 0},
            "sm_guid": "0x248a0703005c3440",
        }
    ]
    assert tools.calls == [["sminfo", "-C", "mlx5_0", "-P", "1"]]


def test_hcas_in_natural_order_and_sminfo_missing_asked_once(tmp_path):
    for hca in ("mlx5_10", "mlx5_2", "mlx5_1"):
        _port(tmp_path, hca, 1)
    tools = FakeTools(sminfo=ToolOutput(error="sminfo not found"))
    ports, _ = ib.collect_ib_ports(Sources(sysfs_root=tmp_path), tools)
    assert [p["hca"] for p in ports] == ["mlx5_1", "mlx5_2", "mlx5_10"]
    assert {p["sm_error"] for p in ports} == {"sminfo not found"}
    assert all("sm_guid" not in p for p in ports)
    assert len(tools.calls) == 1


def test_down_port_and_port_without_sm_are_not_asked(tmp_path):
    _port(tmp_path, "mlx5_0", 1, state="1: DOWN", lid="0x0", sm_lid="0x0")
    _port(tmp_path, "mlx5_1", 1, sm_lid="0x0")
    tools = FakeTools()
    ports, _ = ib.collect_ib_ports(Sources(sysfs_root=tmp_path), tools)
    assert ports[0]["state"] == "DOWN"
    assert ports[0]["phys_state"] == "Disabled"
    assert ports[0]["sm_error"] == "port is DOWN, so no subnet manager answers"
    assert "SM lid 0" in ports[1]["sm_error"]
    assert tools.calls == []


def test_init_port_names_the_missing_subnet_manager(tmp_path):
    _port(tmp_path, "mlx5_0", 1, state="2: INIT", lid="0xffff")
    tools = FakeTools()
    ports, _ = ib.collect_ib_ports(Sources(sysfs_root=tmp_path), tools)
    assert ports[0]["state"] == "INIT"
    assert "no subnet manager has made it ACTIVE" in ports[0]["sm_error"]
    assert tools.calls == []


def test_efa_devices_get_neither_sminfo_nor_a_network(tmp_path):
    for n in range(4):
        _port(tmp_path, f"rdmap{n}s27", 1, link="Unspecified", rate="100 Gb/sec (4X EDR)", lid="0x0", sm_lid="0x0")
    tools = FakeTools()
    ports, problems = ib.collect_ib_ports(Sources(sysfs_root=tmp_path), tools)
    assert len(ports) == 4 and problems == []
    assert tools.calls == []
    assert not any(k in p for p in ports for k in ("sm_guid", "sm_error", "network", "network_error"))


def test_sminfo_failure_is_the_sm_error(tmp_path):
    _port(tmp_path, "mlx5_0", 1)
    failure = ToolOutput(error="sminfo exited with status 255: ibwarn: can't open UMAD port", exit_code=255)
    ports, _ = ib.collect_ib_ports(Sources(sysfs_root=tmp_path), FakeTools(sminfo=failure))
    assert ports[0]["sm_error"] == failure.error


def test_roce_port_gets_its_netdev_network_and_no_sm(tmp_path):
    _port(
        tmp_path,
        "mlx5_bond_0",
        1,
        link="Ethernet",
        rate="200 Gb/sec (2X HDR)",
        lid="0x0",
        sm_lid="0x0",
        gid="fe80:0000:0000:0000:201d:97ff:fe00:56cf",
        ndev="bond0",
    )
    tools = FakeTools(ip={"bond0": _ip("bond0", "10.44.3.9", 22)})
    ports, _ = ib.collect_ib_ports(Sources(sysfs_root=tmp_path), tools)
    port = ports[0]
    assert port["network"] == "10.44.0.0/22"
    assert port["netdev"] == "bond0"
    assert port["port_guid"] == "0x201d97fffe0056cf"
    assert "lid" not in port and "sm_lid" not in port and "sm_guid" not in port and "sm_error" not in port
    assert tools.calls == [["ip", "-j", "-4", "addr", "show", "dev", "bond0"]]


def test_roce_netdev_from_the_pci_function_when_the_gid_table_says_nothing(tmp_path):
    _port(tmp_path, "mlx5_3", 1, link="Ethernet", lid="0x0", sm_lid="0x0")
    (tmp_path / "class" / "infiniband" / "mlx5_3" / "device" / "net" / "ens7f0np0").mkdir(parents=True)
    tools = FakeTools(ip={"ens7f0np0": _ip("ens7f0np0", "192.168.40.7", 24)})
    ports, _ = ib.collect_ib_ports(Sources(sysfs_root=tmp_path), tools)
    assert ports[0]["network"] == "192.168.40.0/24"


def test_roce_without_ipv4_says_why(tmp_path):
    _port(tmp_path, "mlx5_3", 1, link="Ethernet", ndev="eth9")
    tools = FakeTools(ip={"eth9": json.dumps([{"ifname": "eth9", "addr_info": []}])})
    ports, _ = ib.collect_ib_ports(Sources(sysfs_root=tmp_path), tools)
    assert "network" not in ports[0]
    assert ports[0]["network_error"] == "eth9 has no IPv4 address"


def test_unreadable_fields_are_left_out_not_zeroed(tmp_path):
    _port(tmp_path, "mlx5_0", 1)
    port_dir = tmp_path / "class" / "infiniband" / "mlx5_0" / "ports" / "1"
    (port_dir / "rate").write_text("garbage\n")
    (port_dir / "lid").unlink()
    ports, _ = ib.collect_ib_ports(Sources(sysfs_root=tmp_path), FakeTools())
    assert "rate_gbps" not in ports[0]
    assert "lid" not in ports[0]
    assert ports[0]["state"] == "ACTIVE"


def test_ibstat_capture_replaces_sysfs_and_asks_no_tool(tmp_path):
    _port(tmp_path, "mlx5_99", 1)  # must be ignored
    tools = FakeTools()
    ports, problems = ib.collect_ib_ports(Sources(sysfs_root=tmp_path, ibstat=capture(PANIC)), tools)
    assert len(ports) == 8 and problems
    assert tools.calls == []
    assert all(p["sm_error"].startswith("not read") for p in ports)


def test_ibstatus_capture_is_accepted_too():
    ports, problems = ib.collect_ib_ports(Sources(ibstat=capture(IBSTATUS)), FakeTools())
    assert len(ports) == 9 and problems == []
    assert "sm_error" not in ports[8]  # the Ethernet port has no SM to miss


def test_missing_capture_is_a_discovery_error(tmp_path):
    with pytest.raises(DiscoveryError):
        ib.collect_ib_ports(Sources(ibstat=tmp_path / "nope.txt"), FakeTools())
