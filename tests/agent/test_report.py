"""build_report: which source is used, what the report holds, and how failures read."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pynvml
import pytest

from agent.discovery import nvidia_smi as smi
from agent.discovery.nvml_fake import FakeNvml
from agent.discovery.report import build_report, collect_gpus, sysfs_bus_id
from agent.discovery.sources import Sources
from agent.discovery.tools import ToolOutput
from tests.captures import capture, read

H100 = "nvidia-smi-q-x_h100-80gb-hbm3-x8_hgx_drv580.105.08_fabric-zero-uuid.xml"
GB200 = "nvidia-smi-q-x_gb200-x4_p6e-gb200_drv580.173.02_fabric-completed-healthy.xml"
MIG_XML = "nvidia-smi-q-x_a100-sxm4-80gb_mig-enabled_drv535.54.03.xml"
TOPO = "nvidia-smi-topo-m_h100-x8_8nics-mlx5_sglang-issue.txt"
NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


class NoLibrary(FakeNvml):
    def __init__(self):
        super().__init__(smi.SmiLog())

    def init(self):
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)


def tools(**outputs: str):
    """A run_tool stand-in: argv joined by spaces -> stdout; anything else is 'not found'."""
    calls: list[str] = []

    def run(argv: list[str]) -> ToolOutput:
        key = " ".join(argv)
        calls.append(key)
        if key in outputs:
            return ToolOutput(stdout=outputs[key], exit_code=0)
        return ToolOutput(error=f"{argv[0]} not found")

    run.calls = calls
    return run


def test_capture_report_gb200():
    report = build_report(Sources(nvidia_smi_xml=capture(GB200)), run=tools(), now=NOW, node=False)
    assert report["schema"] == 1
    assert report["collected_at"] == "2026-01-02T03:04:05+00:00"
    assert (report["driver_version"], report["cuda_version"]) == ("580.173.02", "13.0")
    assert report["gpu_source"] == "capture"
    assert [g["class"] for g in report["gpus"]] == ["gb200-185g"] * 4
    assert report["problems"] == []
    json.dumps(report)


def test_capture_report_with_topology():
    sources = Sources(nvidia_smi_xml=capture(H100), topo=capture(TOPO))
    report = build_report(sources, run=tools(), node=False)
    assert report["gpus"][0]["nics"]["mlx5_0"] == "PIX"
    assert report["gpus"][7]["numa"] == 1


def test_no_nvml_and_no_nvidia_smi_is_a_cpu_node():
    report = build_report(Sources(), nvml_api=NoLibrary(), run=tools(), node=False)
    assert report["gpu_source"] == "none"
    assert report["gpus"] == []
    assert report["problems"] == ["NVML: NVML Shared Library Not Found", "nvidia-smi not found"]
    assert "driver_version" not in report


def test_live_nvml_path_with_topology():
    fake = FakeNvml(smi.parse_xml(read(H100)))
    run = tools(**{"nvidia-smi topo -m": read(TOPO)})
    report = build_report(Sources(sysfs_root=Path("/nonexistent")), nvml_api=fake, run=run, node=False)
    assert report["gpu_source"] == "nvml"
    assert report["driver_version"] == "580.105.08"
    assert report["gpus"][2]["nics"]["mlx5_2"] == "PIX"
    assert report["gpus"][2]["nvlink_peers"] == [0, 1, 3, 4, 5, 6, 7]
    assert fake.initialised is False  # shut down again
    assert report["problems"] == []


def test_live_nvidia_smi_path_asks_for_the_listing_when_mig_is_on():
    listing = "GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-513536b6-7d19-9063-b049-1e69664bb298)\n" + "".join(
        f"  MIG 1g.20gb Device {i}: (UUID: MIG-000{i})\n" for i in range(4)
    )
    run = tools(**{"nvidia-smi -q -x": read(MIG_XML), "nvidia-smi -L": listing})
    report = build_report(Sources(use_nvml=False, sysfs_root=Path("/nonexistent")), run=run, node=False)
    assert report["gpu_source"] == "nvidia-smi"
    assert [g["uuid"] for g in report["gpus"]] == ["MIG-0000", "MIG-0001", "MIG-0002", "MIG-0003"]
    assert "nvidia-smi -L" in run.calls
    assert "nvidia-smi topo -m: nvidia-smi not found (NVLink peers and NIC nearness unknown)" in report["problems"]


def test_sysfs_numa_on_the_live_path(tmp_path):
    for bus, node in (("0000:53:00.0", "0"), ("0000:64:00.0", "-1")):
        d = tmp_path / "bus" / "pci" / "devices" / bus
        d.mkdir(parents=True)
        (d / "numa_node").write_text(node + "\n")
    fake = FakeNvml(smi.parse_xml(read(H100)))
    section = collect_gpus(Sources(sysfs_root=tmp_path), nvml_api=fake, run=tools())
    assert section.gpus[0]["numa"] == 0
    assert "numa" not in section.gpus[1]  # -1: the kernel does not know


def test_sysfs_bus_id():
    assert sysfs_bus_id("00000000:9B:00.0") == "0000:9b:00.0"


def test_garbled_capture_is_a_problem_not_an_exception(tmp_path):
    bad = tmp_path / "bad.xml"
    bad.write_text(read(H100)[:5000])
    section = collect_gpus(Sources(nvidia_smi_xml=bad), run=tools())
    assert section.gpus == [] and section.read == []
    assert len(section.unreadable) == 1
    assert section.unreadable[0].startswith(f"cannot read {bad}: nvidia-smi -q -x output is not valid XML")


def test_missing_capture_file(tmp_path):
    section = collect_gpus(Sources(nvidia_smi_xml=tmp_path / "nope.xml"), run=tools())
    assert section.unreadable == [f"cannot read {tmp_path / 'nope.xml'}: No such file or directory"]


def test_text_capture_when_xml_is_absent():
    sources = Sources(nvidia_smi_text=capture("nvidia-smi-q_h200-single_drv550.90.12_fabric-completed.txt"))
    report = build_report(sources, run=tools(), node=False)
    (gpu,) = report["gpus"]
    assert gpu["class"] == "h200-140g"
    assert gpu["fabric"]["cluster_uuid"] == "00000000-0000-0000-0000-000000000000"
    assert gpu["nvlink_peers"] == []


def test_replaying_never_runs_tools():
    run = tools()
    build_report(Sources(nvidia_smi_xml=capture(GB200)), run=run, node=False)
    assert run.calls == []


@pytest.mark.parametrize("name", [GB200, H100])
def test_report_merges_the_node_sections(name):
    pytest.importorskip("agent.discovery.node")
    report = build_report(Sources(nvidia_smi_xml=capture(name)), run=tools(), now=NOW)
    for key in ("imex", "host", "disks"):
        assert key in report, key
    assert report["gpus"] and report["gpu_source"] == "capture"
    assert isinstance(report["problems"], list)
    json.dumps(report)
