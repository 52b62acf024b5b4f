"""Every capture in ../shared/fixtures through ``llmgw doctor``, with the verdict a person would give it.

The machine around the captured cards is a fake tree (x86-64 with AVX2, no
IMEX, no channel, no model dir), so only the capture decides the GPU rows.
A capture that is not a doctor input is listed with the reason, and a test
makes sure every file in the folder is in one of the two tables: a new
capture forces a decision.
"""

from __future__ import annotations

import pytest

from agent.discovery import fabric_facts
from agent.discovery import nvidia_smi as smi
from agent.doctor.checks import FAIL, OK, WARN, fabric_verdict
from tests.agent.doctor_tree import Tree, run_doctor, seen, verdict
from tests.captures import FIXTURES, capture, read

XML, TEXT, LIST = "--nvidia-smi-xml", "--nvidia-smi-text", "--nvidia-smi-list"
GPU_ROWS = ("driver", "gpu health", "nvlink fabric", "nvlink domain", "imex", "imex channel", "mig")

# capture -> (option, {check: worst status}, words the rows must show); checks not named must be ok.
GPU_CAPTURES: dict[str, tuple[str, dict[str, str], list[str]]] = {
    "nvidia-smi-q-x_gb200-x4_p6e-gb200_drv580.173.02_fabric-completed-healthy.xml": (
        XML,
        # The fabric passes; without IMEX and its channel (this fake machine has neither) the domain is unusable.
        {"imex": FAIL, "imex channel": FAIL},
        ["joined 00000001-0000-0000-0000-000000000001/2, bandwidth full", "all 4 cards in"],
    ),
    "nvidia-smi-q-x_h100-80gb-hbm3-x8_hgx_drv580.105.08_fabric-zero-uuid.xml": (
        XML,
        {},
        ["gpus 0, 1, 2, 3, 4, 5, 6, 7: no multi-node domain (single NVSwitch)", "in no multi-node NVLink domain"],
    ),
    "MOCK_nvidia-smi-q-x_gb200-profile_gpu0-ecc-dram-uncorrectable.xml": (
        XML,
        {"gpu health": FAIL, "imex": FAIL, "imex channel": FAIL},
        ["gpu 0: 5 uncorrectable ECC errors", "gpu 0: row remapping failed"],
    ),
    "MOCK_nvidia-smi-q-x_gb200-profile_gpu1-lost.xml": (
        XML,
        {"gpu health": FAIL, "nvlink domain": FAIL, "imex": FAIL, "imex channel": FAIL},
        ["gpu 1: GPU is lost", "gpu 1 not in"],
    ),
    "UPSTREAM-EDITED_nvidia-smi-q-d-PAGE_RETIREMENT_x8_retired-pages-nonzero.txt": (
        TEXT,
        {"gpu health": FAIL},
        ["gpu 0: 65 retired pages", "gpus 1, 3, 5, 7: retired pages pending"],
    ),
    "nvidia-smi-q-d-PAGE_RETIREMENT_x8-azure-vm_drv535.86.10_clean.txt": (TEXT, {}, ["8 cards healthy"]),
    "nvidia-smi-L_gh200-96gb-x2_mig-7x1g.12gb_yaml-comment.txt": (
        LIST,
        {"gpu health": WARN},  # -L names instances but says nothing of health
        ["gpu 0: MIG on, 7 instances (7× 1g.12gb)", "gpu 1: MIG on, 7 instances"],
    ),
    "nvidia-smi-q-x_a100-sxm4-40gb-single_drv570.148.08.xml": (XML, {}, ["not supported by this card"]),
    "nvidia-smi-q-x_a100-sxm4-80gb_mig-enabled_drv535.54.03.xml": (
        XML,
        # The telegraf authors kept one of four cards; the XML names no MIG UUIDs, which placement needs.
        {"driver": WARN, "mig": WARN},
        ["gpu 0: MIG on, 4 instances (4× 1g.20gb)", "4 GPUs are attached but lists 1"],
    ),
    "nvidia-smi-q-x_quadro-p2000_drv525.125.06.xml": (XML, {}, ["no card supports MIG"]),
    "nvidia-smi-q-x_rtx-a5000-x2_drv590.44.01.xml": (XML, {}, ["2 cards healthy"]),
    "nvidia-smi-q-x_rtx-pro-6000-blackwell-maxq_drv590.44.01.xml": (XML, {}, ["1 card healthy"]),
    "nvidia-smi-q-x_rtx3080_drv595.58.03_v13-full-fabric-block.xml": (XML, {}, ["not supported by this card"]),
    "nvidia-smi-q-x_tesla-t4-single_aws-g4dn_drv595.91.07.xml": (XML, {}, ["driver 595.91.07"]),
    "nvidia-smi-q-x_tesla-t4_drv515.105.01.xml": (XML, {}, ["no fabric reported (an older driver"]),
    "nvidia-smi-q_a10-single_drv535.129.03.txt": (TEXT, {"gpu health": FAIL}, ["row remapping pending"]),
    "nvidia-smi-q_h100-80gb-hbm3-x8_drv535.161.08.txt": (TEXT, {}, ["no multi-node domain (single NVSwitch)"]),
    "nvidia-smi-q_h100-80gb-hbm3-x8_drv535.183.01_fabric-completed.txt": (
        TEXT,
        {},
        ["no multi-node domain (single NVSwitch)"],
    ),
    "nvidia-smi-q_h100_drv535.183.01_truncated-invalid.txt": (TEXT, {"driver": FAIL}, ["truncated or damaged"]),
    "nvidia-smi-q_h200-single_drv550.90.12_fabric-completed.txt": (TEXT, {}, ["no multi-node domain"]),
    "nvidia-smi-q_rtx4090-x8_drv535.154.05.txt": (TEXT, {}, ["8 cards healthy"]),
    "nvidia-smi-q_titan-v-single_drv560.35.03.txt": (TEXT, {}, ["driver 560.35.03"]),
    # The default table is not -q output: doctor says so instead of guessing.
    "nvidia-smi_default-table_h100-sxm-x8_drv565.57.01.txt": (TEXT, {"driver": FAIL}, ["NVSMI LOG header"]),
    "nvidia-smi_default-table_h100-x8_drv550.90.07.txt": (TEXT, {"driver": FAIL}, ["NVSMI LOG header"]),
}

# Captures that are read with another one, tested below.
COMBINED = {
    "nvidia-imex-ctl-N_gb200-nvl72_p6e_18-nodes_up.txt": "IMEX of an NVL72: with the GB200 tray, a clean node",
    "nvidia-imex-ctl-N_gh200_1-node_up.txt": "IMEX of one GH200: with its -L listing, the channel decides",
    "dmesg_xid-119_gsp-rpc-timeout_h100.log": "an Xid 119 on the H100 535.161.08 capture's PCI 9b:00",
    "FRAGMENT_nvidia-smi-q_fabric_insufficient-resources.txt": "a fabric block alone: fails the fabric check",
    "FRAGMENT_nvidia-smi-q_grep-fabric_gb200_unhealthy-summary.txt": "a fabric block alone: fails the fabric check",
    "nvidia-smi-topo-m_h100-x8_8nics-mlx5_sglang-issue.txt": "topology: adds NIC nearness, no verdict of its own",
    "DOC-EXCERPT_imex-channels_dev-nvidia-caps-imex-channels.txt": "the source of the channel row's advice",
}

NOT_DOCTOR_INPUTS = {
    "SOURCES.md": "where the captures come from",
    "DOC-EXCERPT_imex-nodes_config.cfg_deployment.txt": "documentation",
    "nvidia-imex-config_template_k8s-dra-driver.cfg": "a config template, not a machine's state",
    "ibnetdiscover-p_edr-fabric-excerpt.txt": "InfiniBand fabrics are judged fleet-wide by the doctor sweeps",
    "ibnetdiscover-p_hdr-fabric-with-sharp-aggregation-node.txt": "fleet-wide (sweeps)",
    "ibnetdiscover_dgx-superpod_ndr_full-fabric.txt": "fleet-wide (sweeps)",
    "ibnetdiscover_gb200-node_isolated-hca_bad.txt": "fleet-wide (sweeps)",
    "ibstat_a100-azure_ibpanic-exit255.txt": "InfiniBand ports: the sweeps compare fabrics across nodes",
    "ibstat_a100-node_cx6-200g_ib-and-eth.txt": "fleet-wide (sweeps)",
    "ibstat_h100-node_cx7-400g_all-active.txt": "fleet-wide (sweeps)",
    "ibstatus_a100-azure_8x-hdr200.txt": "fleet-wide (sweeps)",
    "ibswinfo_switchib-edr-msb7790_fan-error.txt": "a switch, not a node",
    "lspci_gb200.txt": "doctor reads the PCI bus from sysfs",
    "nv-fabricmanager_log_8gpu-multicast.log": "a log for people; the cards' fabric state is what doctor judges",
    "nvidia-smi-nvlink-status_a100-sxm4-80gb-x8.txt": "per-link status: not read by discovery",
    "nvidia-smi-nvlink-status_a100-sxm4-80gb_single-gpu7_tabs.txt": "not read by discovery",
    "nvidia-smi-nvlink-status_a100_all-links-inactive-error.txt": "not read by discovery",
    "nvml-fabric_nvml.h-13.3.29_excerpt.h": "a header excerpt",
    "nvml-fabric_pynvml-13.615.71_excerpt.py": "a binding excerpt",
    "perfquery-E_rcv-error-details_edr-switch-port1.txt": "counters: fleet-wide (sweeps)",
    "perfquery-x_edr-hca-lid134.txt": "counters: fleet-wide (sweeps)",
    "perfquery-x_edr-switch-lid1719_2ports.txt": "counters: fleet-wide (sweeps)",
}


def test_every_capture_has_a_decision():
    decided = set(GPU_CAPTURES) | set(COMBINED) | set(NOT_DOCTOR_INPUTS)
    present = {p.name for p in FIXTURES.iterdir()}
    assert present - decided == set(), "a capture nobody decided about"
    assert decided - present == set(), "a capture that is gone"


@pytest.mark.parametrize("name", sorted(GPU_CAPTURES))
def test_the_verdict_a_person_would_give(name, tmp_path, capsys):
    option, expected, words = GPU_CAPTURES[name]
    status, rows = run_doctor(Tree(tmp_path), capsys, option, str(capture(name)))
    for check in GPU_ROWS:
        assert verdict(rows, check) == expected.get(check, OK), (check, rows[check])
    text = " | ".join(seen(rows, c) for c in rows)
    for w in words:
        assert w in text
    assert status == (1 if FAIL in expected.values() else 0)


def test_a_gb200_tray_with_imex_up_and_its_channel_is_trusted(tmp_path, capsys):
    tree = Tree(tmp_path)
    tree.imex_channel(0)
    models = tmp_path / "models"
    models.mkdir()
    status, rows = run_doctor(
        tree,
        capsys,
        XML,
        str(capture("nvidia-smi-q-x_gb200-x4_p6e-gb200_drv580.173.02_fabric-completed-healthy.xml")),
        "--imex-status",
        str(capture("nvidia-imex-ctl-N_gb200-nvl72_p6e_18-nodes_up.txt")),
    )
    assert {c: verdict(rows, c) for c in GPU_ROWS} == dict.fromkeys(GPU_ROWS, OK)
    assert "domain UP" in seen(rows, "imex")
    assert "channel0 present" in seen(rows, "imex channel")
    assert status == 0


def test_imex_up_without_a_channel_fails_the_channel_row(tmp_path, capsys):
    listing = capture("nvidia-smi-L_gh200-96gb-x2_mig-7x1g.12gb_yaml-comment.txt")
    imex = capture("nvidia-imex-ctl-N_gh200_1-node_up.txt")
    status, rows = run_doctor(Tree(tmp_path), capsys, LIST, str(listing), "--imex-status", str(imex))
    assert verdict(rows, "imex") == OK
    assert verdict(rows, "imex channel") == FAIL and status == 1
    assert "mknod" in rows["imex channel"][0]["todo"]
    # The advice is the one NVIDIA's page gives.
    doc = read("DOC-EXCERPT_imex-channels_dev-nvidia-caps-imex-channels.txt")
    assert "mknod /dev/nvidia-caps-imex-channels/channel0 c <major number> 0" in doc
    assert "grep nvidia-caps-imex-channels" in rows["imex channel"][0]["todo"]


def test_an_xid_in_the_kernel_log_fails_its_card(tmp_path, capsys):
    h100 = capture("nvidia-smi-q_h100-80gb-hbm3-x8_drv535.161.08.txt")
    log = capture("dmesg_xid-119_gsp-rpc-timeout_h100.log")
    status, rows = run_doctor(Tree(tmp_path), capsys, TEXT, str(h100), "--kernel-log", str(log))
    assert verdict(rows, "gpu health") == FAIL and status == 1
    failing = [r for r in rows["gpu health"] if r["status"] == FAIL]
    assert len(failing) == 1 and failing[0]["seen"].startswith("gpu ")
    assert "Xid 119" in failing[0]["seen"] and "Xid catalogue" in failing[0]["todo"]


def test_the_topology_capture_changes_no_verdict(tmp_path, capsys):
    h100 = capture("nvidia-smi-q_h100-80gb-hbm3-x8_drv535.161.08.txt")
    topo = capture("nvidia-smi-topo-m_h100-x8_8nics-mlx5_sglang-issue.txt")
    status, rows = run_doctor(Tree(tmp_path), capsys, TEXT, str(h100), "--topo", str(topo))
    assert status == 0 and all(verdict(rows, c) == OK for c in GPU_ROWS)


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("FRAGMENT_nvidia-smi-q_fabric_insufficient-resources.txt", "registration failed: Insufficient Resources"),
        ("FRAGMENT_nvidia-smi-q_grep-fabric_gb200_unhealthy-summary.txt", "fabric health: Unhealthy"),
    ],
)
def test_fabric_fragments_fail(name, words):
    fabric = fabric_facts.fabric_report(fabric_facts.fabric_from_smi(smi.parse_fabric_block(read(name))))
    status, text, todo = fabric_verdict(fabric)
    assert status == FAIL and words in text and "nvidia-fabricmanager" in todo
