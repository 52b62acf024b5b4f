"""The same memory-health facts from every source: ``nvidia-smi -q``, ``-q -x`` and NVML.

NVML is the FakeNvml over the same parsed capture (it raises what the driver would for what the
capture lacks), so "the same" means: the NVML reading path and the nvidia-smi path give equal
``ecc``, ``remapped_rows``, ``retired_pages`` and ``health`` for every card of every capture.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.discovery import gpus as G
from agent.discovery import nvidia_smi as smi
from agent.discovery import nvml as N
from agent.discovery.nvml_fake import FakeNvml
from tests.captures import all_captures, read

HERE = Path(__file__).resolve().parent / "captures"
A100_TEXT = HERE / "nvidia-smi-q_a100-sxm4-80gb-x4_drv555.42.02_remap-pending.txt"
HEALTH_KEYS = ("ecc", "remapped_rows", "retired_pages", "health")
XML = [p.name for p in all_captures(suffix=".xml")]
TEXT = [
    p.name
    for p in all_captures(suffix=".txt")
    if p.name.startswith(("nvidia-smi-q_", "nvidia-smi-q-d-", "UPSTREAM-EDITED_nvidia-smi-q"))
    and "truncated" not in p.name
]


def parse(name: str) -> smi.SmiLog:
    if name.endswith(".xml"):
        return smi.parse_xml(read(name))
    return smi.parse_text(read(name))


def health_fields(gpus: list[dict]) -> list[dict]:
    return [{k: e[k] for k in HEALTH_KEYS if k in e} for e in gpus]


def via_smi(log: smi.SmiLog) -> list[dict]:
    return health_fields(G.entries(G.cards_from_smi(log)[0])[0])


def via_nvml(log: smi.SmiLog) -> list[dict]:
    return health_fields(G.entries(N.read_cards(FakeNvml(log)).cards)[0])


def a100() -> smi.SmiLog:
    return smi.parse_text(A100_TEXT.read_text())


@pytest.mark.parametrize("name", XML + TEXT)
def test_nvml_reads_the_same_health_as_nvidia_smi(name):
    log = parse(name)
    assert via_nvml(log) == via_smi(log)


def test_the_same_on_the_kept_capture():
    assert via_nvml(a100()) == via_smi(a100())


def test_text_and_xml_name_the_ecc_counters_alike():
    # No capture pair of one card in both formats exists; the same generation in both must at least
    # give the same counter names, so that the same card would read the same.
    def keys(name: str) -> set[str]:
        return set(parse(name).gpus[0].ecc_counters)

    assert keys("nvidia-smi-q_h100-80gb-hbm3-x8_drv535.183.01_fabric-completed.txt") == keys(
        "nvidia-smi-q-x_h100-80gb-hbm3-x8_hgx_drv580.105.08_fabric-zero-uuid.xml"
    )
    assert keys("nvidia-smi-q_titan-v-single_drv560.35.03.txt") == keys("nvidia-smi-q-x_quadro-p2000_drv525.125.06.xml")
    assert keys("nvidia-smi-q_a10-single_drv535.129.03.txt") == keys("nvidia-smi-q-x_tesla-t4_drv515.105.01.xml")


def test_a_pending_remap_is_a_problem_and_a_settled_one_a_fact():
    gpus = G.entries(G.cards_from_smi(a100())[0])[0]
    pending, settled = gpus[1], gpus[2]
    assert pending["remapped_rows"] == {
        "correctable": 1,
        "uncorrectable": 0,
        "pending": True,
        "failure": False,
        "bank_availability": {"max": 639, "high": 1, "partial": 0, "low": 0, "none": 0},
    }
    assert pending["ecc"]["volatile"]["dram_correctable"] == 353
    assert pending["ecc"]["aggregate"] == {
        "sram_correctable": 0,
        "sram_uncorrectable": 0,
        "dram_correctable": 353,
        "dram_uncorrectable": 0,
    }
    assert pending["ecc"]["sram_threshold_exceeded"] is False
    assert pending["health"] == ["row remapping pending (reset the GPU)"]
    assert settled["remapped_rows"]["correctable"] == 1 and settled["remapped_rows"]["pending"] is False
    assert settled["health"] == []
    assert gpus[0]["remapped_rows"]["bank_availability"]["max"] == 640


def test_aggregate_ecc_of_the_past_is_a_fact_not_a_fault():
    t4 = G.entries(G.cards_from_smi(parse("nvidia-smi-q-x_tesla-t4-single_aws-g4dn_drv595.91.07.xml"))[0])[0][0]
    assert t4["ecc"]["aggregate"]["dram_correctable"] == 1
    assert t4["ecc"]["volatile"] == dict.fromkeys(G.ECC_COUNTERS, 0)
    assert t4["retired_pages"] == {"single_bit": 0, "double_bit": 0, "pending": False}
    assert "remapped_rows" not in t4  # "N/A": a T4 has no row remapper
    assert t4["health"] == []


def test_uncorrectable_counters_and_a_failed_remap():
    gpus = G.entries(G.cards_from_smi(parse("MOCK_nvidia-smi-q-x_gb200-profile_gpu0-ecc-dram-uncorrectable.xml"))[0])[0]
    assert gpus[0]["ecc"]["volatile"] == {"dram_correctable": 0, "dram_uncorrectable": 5}
    assert gpus[0]["ecc"]["aggregate"] == {"dram_correctable": 0, "dram_uncorrectable": 8}
    assert gpus[0]["remapped_rows"] == {"correctable": 0, "uncorrectable": 1, "pending": False, "failure": True}


def test_the_a10_remap_counts_from_plain_text():
    a10 = G.entries(G.cards_from_smi(parse("nvidia-smi-q_a10-single_drv535.129.03.txt"))[0])[0][0]
    assert a10["remapped_rows"]["uncorrectable"] == 4 and a10["remapped_rows"]["pending"] is True
    assert a10["ecc"]["volatile"]["sram_uncorrectable"] == 0


def test_unsupported_counters_are_unknown_not_zero():
    for name in ("nvidia-smi-q-x_quadro-p2000_drv525.125.06.xml", "nvidia-smi-q_titan-v-single_drv560.35.03.txt"):
        entry = G.entries(G.cards_from_smi(parse(name))[0])[0][0]
        assert "ecc" not in entry
    lost = G.entries(G.cards_from_smi(parse("MOCK_nvidia-smi-q-x_gb200-profile_gpu1-lost.xml"))[0])[0][1]
    assert "remapped_rows" not in lost and "ecc" not in lost


def test_pre_turing_counters_sum_the_on_chip_locations():
    # The Quadro capture with every per-location counter set to 1: DRAM is "Device Memory",
    # SRAM the six on-chip locations, in nvidia-smi and NVML alike.
    text = read("nvidia-smi-q-x_quadro-p2000_drv525.125.06.xml")
    block = text[text.index("<ecc_errors>") : text.index("</ecc_errors>")]
    log = smi.parse_xml(text.replace(block, block.replace(">N/A<", ">1<")))
    expected = {"sram_correctable": 6, "sram_uncorrectable": 6, "dram_correctable": 1, "dram_uncorrectable": 1}
    assert via_smi(log)[0]["ecc"] == {"volatile": expected, "aggregate": expected}
    assert via_nvml(log) == via_smi(log)


def test_threshold_exceeded_is_a_health_problem():
    text = A100_TEXT.read_text().replace("SRAM Threshold Exceeded       : No", "SRAM Threshold Exceeded       : Yes", 1)
    first = G.entries(G.cards_from_smi(smi.parse_text(text))[0])[0][0]
    assert first["ecc"]["sram_threshold_exceeded"] is True
    assert first["health"] == ["SRAM uncorrectable errors over NVIDIA's threshold (run the field diagnostic)"]
