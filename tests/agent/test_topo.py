"""nvidia-smi topo -m: NVLink peers, NIC nearness through the NIC legend, NUMA affinity."""

from __future__ import annotations

import pytest

from agent.discovery.errors import DiscoveryError
from agent.discovery.topo import parse_topo
from tests.captures import read

H100 = "nvidia-smi-topo-m_h100-x8_8nics-mlx5_sglang-issue.txt"


def test_h100_all_to_all_nvlink():
    topo = parse_topo(read(H100))
    assert sorted(topo.gpus) == list(range(8))
    assert topo.gpus[0].nvlinks == {i: 18 for i in range(1, 8)}
    assert sorted(topo.gpus[5].nvlinks) == [0, 1, 2, 3, 4, 6, 7]


def test_h100_nics_through_the_legend():
    topo = parse_topo(read(H100))
    assert topo.nic_names["NIC3"] == "mlx5_3"
    for i in range(8):
        assert topo.gpus[i].nics[f"mlx5_{i}"] == "PIX"
    assert topo.gpus[0].nics["mlx5_1"] == "NODE"
    assert topo.gpus[0].nics["mlx5_4"] == "SYS"


def test_h100_numa_and_cpu_affinity():
    topo = parse_topo(read(H100))
    assert [topo.gpus[i].numa for i in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert topo.gpus[4].cpu_affinity == "48-95,144-191"


def test_tab_separated_old_style_with_device_names_in_the_header():
    text = (
        "\tGPU0\tGPU1\tmlx5_0\tCPU Affinity\tNUMA Affinity\n"
        "GPU0\t X \tSOC\tPHB\t0-11\t0\n"
        "GPU1\tSOC\t X \tPXB\t12-23\tN/A\n"
        "mlx5_0\tPHB\tPXB\t X \n\nLegend:\n  X = Self\n"
    )
    topo = parse_topo(text)
    assert topo.gpus[0].nvlinks == {}
    assert topo.gpus[0].nics == {"mlx5_0": "PHB"}
    assert topo.gpus[1].nics == {"mlx5_0": "PXB"}
    assert topo.gpus[1].numa is None  # N/A: unknown


def test_single_gpu():
    topo = parse_topo("\tGPU0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\nGPU0\t X \t0-7\t0\t\tN/A\n")
    assert topo.gpus[0].numa == 0 and topo.gpus[0].nvlinks == {}


@pytest.mark.parametrize("text", ["", "Legend:\n X = Self\n", "\tGPU0\tGPU1\n"])
def test_errors(text):
    with pytest.raises(DiscoveryError):
        parse_topo(text)


def test_short_row_is_an_error():
    with pytest.raises(DiscoveryError, match="shorter than the header"):
        parse_topo("\tGPU0\tGPU1\tGPU2\nGPU0\t X \tNV4\n")
