"""collect_node on a whole fake machine: every section comes out, and a failing one costs only itself."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.discovery import engines, host, imex, node
from agent.discovery.sources import Sources
from agent.discovery.tools import ToolOutput
from tests.captures import capture, read

SMINFO = "sminfo: sm lid 1 sm guid 0x248a0703005c3440, activity count 5521 priority 15 state 3 SMINFO_MASTER\n"
IP_ALL = json.dumps(
    [
        {"ifname": "lo", "addr_info": [{"family": "inet", "local": "127.0.0.1", "prefixlen": 8}]},
        {"ifname": "eth0", "addr_info": [{"family": "inet", "local": "172.31.54.95", "prefixlen": 20}]},
    ]
)


class Tools:
    """The node's command-line tools, answering as a healthy GB200 tray would."""

    def __init__(self, imex_text: str | None = None):
        self.imex_text = imex_text
        self.calls: list[list[str]] = []

    def __call__(self, argv: list[str]) -> ToolOutput:
        self.calls.append(argv)
        if argv[0] == "nvidia-imex-ctl":
            if self.imex_text is None:
                return ToolOutput(error="nvidia-imex-ctl not found")
            return ToolOutput(stdout=self.imex_text, exit_code=0)
        if argv[0] == "sminfo":
            return ToolOutput(stdout=SMINFO, exit_code=0)
        if argv[:2] == ["ip", "-j"]:
            return ToolOutput(stdout=IP_ALL, exit_code=0)
        return ToolOutput(error=f"{argv[0]} not found")


def _machine(tmp_path: Path, *, ib: bool = True, imex_daemon: bool = True, models: bool = True) -> Sources:
    proc, sys, dev, etc = (tmp_path / n for n in ("proc", "sys", "dev", "etc"))
    (proc / "sys" / "kernel").mkdir(parents=True)
    (proc / "sys" / "kernel" / "hostname").write_text("gb200-tray-11\n")
    (proc / "sys" / "kernel" / "osrelease").write_text("6.8.0-1015-nvidia-64k\n")
    (proc / "sys" / "kernel" / "arch").write_text("aarch64\n")
    (proc / "cpuinfo").write_text(
        "processor : 0\nFeatures : fp asimd sve2\nCPU implementer : 0x41\nCPU part : 0xd4f\n\n"
        "processor : 1\nFeatures : fp asimd sve2\nCPU implementer : 0x41\nCPU part : 0xd4f\n"
    )
    (proc / "meminfo").write_text("MemTotal: 8000000 kB\nMemAvailable: 6000000 kB\n")
    (proc / "loadavg").write_text("0.50 0.40 0.30 1/100 999\n")
    (proc / "stat").write_text("cpu  10 0 10 80 0 0 0 0 0 0\n")
    (proc / "self").mkdir()
    (proc / "self" / "mountinfo").write_text(
        f"22 1 259:2 / {tmp_path.resolve()} rw - ext4 /dev/nvme0n1p2 rw\n23 22 0:21 / /proc rw - proc proc rw\n"
    )
    if imex_daemon:
        (proc / "812").mkdir()
        (proc / "812" / "comm").write_text("nvidia-imex\n")
    (dev / "nvidia-caps-imex-channels").mkdir(parents=True)
    (dev / "nvidia-caps-imex-channels" / "channel0").write_text("")
    etc.mkdir()
    (etc / "os-release").write_text('ID=ubuntu\nVERSION_ID="24.04"\nPRETTY_NAME="Ubuntu 24.04.1 LTS"\n')
    sys.mkdir()
    if ib:
        port = sys / "class" / "infiniband" / "mlx5_0" / "ports" / "1"
        (port / "gids").mkdir(parents=True)
        for name, value in {
            "state": "4: ACTIVE",
            "phys_state": "5: LinkUp",
            "rate": "400 Gb/sec (4X NDR)",
            "link_layer": "InfiniBand",
            "lid": "0x2a",
            "sm_lid": "0x1",
        }.items():
            (port / name).write_text(value + "\n")
        (port / "gids" / "0").write_text("fe80:0000:0000:0000:a088:c203:00da:6342\n")
    model_dirs: tuple[Path, ...] = ()
    if models:
        (tmp_path / "models").mkdir()
        (tmp_path / "models" / "tiny.gguf").write_bytes(b"GGUF" + b"\0" * 12)
        model_dirs = (tmp_path / "models",)
    return Sources(proc_root=proc, sysfs_root=sys, dev_root=dev, etc_root=etc, model_dirs=model_dirs)


def test_a_healthy_gb200_tray_reports_every_section(tmp_path):
    tools = Tools(imex_text=read("nvidia-imex-ctl-N_gb200-nvl72_p6e_18-nodes_up.txt"))
    report = node.collect_node(_machine(tmp_path), run=tools)
    assert report["problems"] == []
    assert set(report) == {"imex", "ib_ports", "host", "load", "disks", "engines", "weights", "problems"}
    assert report["imex"]["state"] == "up"
    assert report["imex"]["node_status"] == "READY"  # found by our address 172.31.54.95 (node #10)
    assert report["imex"]["channels"] == [0]
    assert report["ib_ports"][0]["sm_guid"] == "0x248a0703005c3440"
    assert report["ib_ports"][0]["rate_gbps"] == 400.0
    assert report["host"]["cpu_model"] == "ARM Neoverse-V2"
    assert report["host"]["arch"] == "aarch64"
    assert "cpu_percent" not in report["load"]  # a fresh sampler has nothing to compare with
    assert report["disks"][0]["mount"] == str(tmp_path.resolve())
    assert report["disks"][0]["model_dirs"] == [str((tmp_path / "models").resolve())]
    assert report["disks"][0]["total_bytes"] > 0
    assert isinstance(report["engines"], dict)
    assert report["weights"] == [
        {"path": str(tmp_path / "models" / "tiny.gguf"), "format": "gguf", "bytes": 16, "name": "tiny"}
    ]
    json.dumps(report)  # the report travels as JSON


def test_a_plain_node_without_imex_or_ib_has_no_problems(tmp_path):
    report = node.collect_node(_machine(tmp_path, ib=False, imex_daemon=False, models=False), run=Tools())
    assert report["imex"]["state"] == "not installed"
    assert report["ib_ports"] == []
    assert "weights" not in report  # no model dir configured: not looked for
    assert report["problems"] == []


def test_the_same_sampler_measures_cpu_between_reports(tmp_path):
    sources = _machine(tmp_path)
    sampler = node.LoadSampler()
    node.collect_node(sources, run=Tools(), sampler=sampler)
    (sources.proc_root / "stat").write_text("cpu  40 0 20 140 0 0 0 0 0 0\n")
    report = node.collect_node(sources, run=Tools(), sampler=sampler)
    assert report["load"]["cpu_percent"] == 40.0


def test_a_garbled_mount_table_costs_only_the_disks(tmp_path):
    sources = _machine(tmp_path)
    (sources.proc_root / "self" / "mountinfo").write_text("this is not a mount table\n")
    report = node.collect_node(sources, run=Tools(imex_text=read("nvidia-imex-ctl-N_gh200_1-node_up.txt")))
    assert "disks" not in report
    assert len(report["problems"]) == 1 and report["problems"][0].startswith("disks: mountinfo line not understood")
    assert report["imex"]["state"] == "up"
    assert report["host"]["hostname"] == "gb200-tray-11"
    assert report["ib_ports"]


def test_an_unexpected_error_in_one_reader_is_contained(tmp_path, monkeypatch):
    def boom(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(imex, "collect_imex", boom)
    report = node.collect_node(_machine(tmp_path), run=Tools())
    assert "imex" not in report
    assert report["problems"] == ["IMEX: could not be collected (RuntimeError: boom)"]
    assert {"ib_ports", "host", "disks"} <= set(report)


def test_replaying_captures(tmp_path):
    live = _machine(tmp_path, ib=False, imex_daemon=False)
    sources = Sources(
        **{
            **live.__dict__,
            "imex_status": capture("nvidia-imex-ctl-N_gh200_1-node_up.txt"),
            "ibstat": capture("ibstat_a100-azure_ibpanic-exit255.txt"),
        }
    )
    tools = Tools()
    report = node.collect_node(sources, run=tools)
    assert report["imex"]["state"] == "up"
    assert len(report["ib_ports"]) == 8
    assert len(report["problems"]) == 1
    assert report["problems"][0].startswith("InfiniBand: ibstat stopped with an error after 8 adapters")
    assert not any(call[0] in ("nvidia-imex-ctl", "sminfo") for call in tools.calls)


def test_a_weights_scan_problem_is_reported_with_the_weights(tmp_path):
    sources = _machine(tmp_path)
    sources = Sources(**{**sources.__dict__, "model_dirs": (*sources.model_dirs, tmp_path / "missing")})
    report = node.collect_node(sources, run=Tools())
    assert len(report["weights"]) == 1
    missing = tmp_path / "missing"
    assert report["problems"] == [f"model weights: model dir {missing} does not exist or is not a directory"]


@pytest.mark.parametrize(("module", "section"), [(host, "read_host"), (host, "read_disks"), (engines, "find_engines")])
def test_each_host_section_fails_alone(tmp_path, monkeypatch, module, section):
    def fail(*args, **kwargs):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(module, section, fail)
    report = node.collect_node(_machine(tmp_path), run=Tools())
    missing = {"read_host": "host", "read_disks": "disks", "find_engines": "engines"}[section]
    assert missing not in report
    assert len(report["problems"]) == 1
    assert {"imex", "ib_ports", "load", "weights"} <= set(report)
