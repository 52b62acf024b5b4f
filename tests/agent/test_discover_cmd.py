"""``llmgw discover`` over captures: JSON, the readable summary, and the exit status."""

from __future__ import annotations

import json

from agent import discover_cmd
from llmgw import cli
from tests.captures import capture, read

GB200 = "nvidia-smi-q-x_gb200-x4_p6e-gb200_drv580.173.02_fabric-completed-healthy.xml"
MIG_XML = "nvidia-smi-q-x_a100-sxm4-80gb_mig-enabled_drv535.54.03.xml"
LOST = "MOCK_nvidia-smi-q-x_gb200-profile_gpu1-lost.xml"
TRUNCATED = "nvidia-smi-q_h100_drv535.183.01_truncated-invalid.txt"


def test_json_from_a_capture(capsys):
    assert discover_cmd.main(["--json", "--nvidia-smi-xml", str(capture(GB200))]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["gpu_source"] == "capture"
    assert [g["fabric"]["clique_id"] for g in report["gpus"]] == [2, 2, 2, 2]


def test_dispatch_through_llmgw_cli(capsys):
    assert cli.main(["discover", "--json", "--nvidia-smi-xml", str(capture(GB200))]) == 0
    assert json.loads(capsys.readouterr().out)["gpus"][0]["class"] == "gb200-185g"


def test_summary_shows_instances_classes_and_problems(capsys):
    assert discover_cmd.main(["--nvidia-smi-xml", str(capture(MIG_XML))]) == 0
    out = capsys.readouterr().out
    assert "0/mig3" in out
    assert "a100-80g-mig-1g.20gb" in out
    assert "nvidia-smi says 4 GPUs are attached but lists 1" in out


def test_summary_of_a_lost_gpu_and_a_domain(capsys):
    assert discover_cmd.main(["--nvidia-smi-xml", str(capture(LOST))]) == 0
    out = capsys.readouterr().out
    assert "GPU is lost" in out
    assert "00000000-0000-0000-0000-000000000001/0" in out  # the mock's cards joined domain (uuid, clique 0)


def test_garbled_only_source_exits_1_with_one_line(tmp_path, capsys):
    bad = tmp_path / "garbled.xml"
    bad.write_text(read(GB200)[:3000])
    assert discover_cmd.main(["--nvidia-smi-xml", str(bad)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"llmgw discover: cannot read {bad}: nvidia-smi -q -x output is not valid XML")


def test_truncated_text_capture_exits_1(capsys):
    assert discover_cmd.main(["--nvidia-smi-text", str(capture(TRUNCATED))]) == 1
    assert "truncated or damaged" in capsys.readouterr().err


def test_one_readable_capture_is_enough(tmp_path, capsys):
    bad = tmp_path / "garbled.txt"
    bad.write_text("garbage")
    args = ["--json", "--nvidia-smi-list", str(bad), "--nvidia-smi-xml", str(capture(GB200))]
    assert discover_cmd.main(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert len(report["gpus"]) == 4
    assert f"cannot read {bad}: nvidia-smi -L output has no 'GPU N: name (UUID: …)' line" in report["problems"]


def test_sources_from_args():
    args = discover_cmd._parser().parse_args(["--no-nvml", "--model-dir", "/a", "--model-dir", "/b", "--topo", "t"])
    sources = discover_cmd.sources_from_args(args)
    assert sources.use_nvml is False
    assert [str(p) for p in sources.model_dirs] == ["/a", "/b"]
    assert str(sources.topo) == "t"
    assert str(sources.sysfs_root) == "/sys"
