"""One H200 read live on the machine lent to a session: nvidia-smi's captures and the NVML reading agree.

The captures in tests/agent/captures were taken one after another on the same
VM (one NVIDIA H200, driver 580.159.04, CUDA 13.0), with ``llmgw discover
--json`` through NVML right after them (SOURCES.md there). The report read
back from each nvidia-smi capture must be what NVML said of the same card,
but for what changes from one second to the next.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent import discover_cmd
from agent.discovery.topo import parse_topo
from tests.captures import read as read_fixture

CAPTURES = Path(__file__).parent / "captures"
XML = CAPTURES / "nvidia-smi-q-x_h200-single_drv580.159.04_vm.xml"
TEXT = CAPTURES / "nvidia-smi-q_h200-single_drv580.159.04_vm.txt"
LIST = CAPTURES / "nvidia-smi-L_h200-single_drv580.159.04_vm.txt"
TOPO = CAPTURES / "nvidia-smi-topo-m_h200-single_drv580.159.04_vm_escapes.txt"
NVML = CAPTURES / "llmgw-discover-json-nvml_h200-single_drv580.159.04_vm.json"

# Read a second apart, these move; everything else about a card must be the same from either source.
VOLATILE = {"temperature_c", "power_w", "utilization_pct"}
# The NVML reading was taken before topo -m's escapes were understood: it has no topology facts.
FROM_TOPO = {"numa", "nics"}


def _report(capsys, *args: str) -> dict:
    assert discover_cmd.main(["--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


def _steady(gpus: list[dict], drop: set[str]) -> list[dict]:
    return [{k: v for k, v in g.items() if k not in drop} for g in gpus]


def test_the_topology_header_underlined_by_terminal_escapes_is_read():
    # nvidia-smi 580 writes ESC[4m … ESC[0m around the header into a file as into a terminal.
    assert "\x1b[4m" in TOPO.read_text()
    topo = parse_topo(TOPO.read_text())
    assert sorted(topo.gpus) == [0]
    assert topo.gpus[0].numa == 0
    assert topo.gpus[0].cpu_affinity == "0-15"
    assert topo.gpus[0].nvlinks == {} and topo.gpus[0].nics == {}


@pytest.mark.parametrize("option,path", [("--nvidia-smi-xml", XML), ("--nvidia-smi-text", TEXT)])
def test_each_nvidia_smi_capture_reads_as_nvml_read_the_same_card(capsys, option, path):
    nvml = json.loads(NVML.read_text())
    assert nvml["gpu_source"] == "nvml"
    captured = _report(capsys, option, str(path), "--topo", str(TOPO))
    assert captured["problems"] == []
    assert (captured["driver_version"], captured["cuda_version"]) == (nvml["driver_version"], nvml["cuda_version"])
    assert _steady(captured["gpus"], VOLATILE | FROM_TOPO) == _steady(nvml["gpus"], VOLATILE)
    (gpu,) = captured["gpus"]
    assert gpu["class"] == "h200-140g" and gpu["memory_mb"] == 143771
    assert gpu["fabric"] == {"state": "Not Supported"}  # a PCIe H200 in a VM: no NVLink fabric
    assert gpu["numa"] == 0 and gpu["nics"] == {}


def test_the_xml_and_the_text_capture_agree(capsys):
    xml = _report(capsys, "--nvidia-smi-xml", str(XML), "--topo", str(TOPO))
    text = _report(capsys, "--nvidia-smi-text", str(TEXT), "--topo", str(TOPO))
    assert _steady(xml["gpus"], VOLATILE) == _steady(text["gpus"], VOLATILE)


def test_the_list_names_the_card_the_others_describe(capsys):
    listed = _report(capsys, "--nvidia-smi-list", str(LIST))
    nvml = json.loads(NVML.read_text())
    assert [(g["index"], g["uuid"], g["name"]) for g in listed["gpus"]] == [
        (g["index"], g["uuid"], g["name"]) for g in nvml["gpus"]
    ]


# An escape sequence as terminals take them: SGR with any parameters, or another CSI final byte.
_ESCAPE = st.builds(
    lambda params, final: f"\x1b[{params}{final}",
    st.from_regex(r"[0-9;]{0,8}", fullmatch=True),
    st.sampled_from("mABCDHJK"),
)
H100 = "nvidia-smi-topo-m_h100-x8_8nics-mlx5_sglang-issue.txt"


@given(st.data())
def test_escapes_anywhere_in_a_matrix_change_nothing_it_says(data):
    text = read_fixture(H100)
    plain = parse_topo(text)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=6)))
    pieces, last = [], 0
    for cut in cuts:
        pieces += [text[last:cut], data.draw(_ESCAPE)]
        last = cut
    decorated = parse_topo("".join(pieces) + text[last:])
    assert decorated == plain
