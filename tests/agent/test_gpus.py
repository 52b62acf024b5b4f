"""GPU entries from the captures: classes, MIG instances, fabric domains, health."""

from __future__ import annotations

import dataclasses

import pytest

from agent.discovery import fabric_facts
from agent.discovery import gpus as G
from agent.discovery import nvidia_smi as smi
from agent.discovery import xids as xid_log
from tests.captures import read

MIG_XML = "nvidia-smi-q-x_a100-sxm4-80gb_mig-enabled_drv535.54.03.xml"
GB200 = "nvidia-smi-q-x_gb200-x4_p6e-gb200_drv580.173.02_fabric-completed-healthy.xml"
H100 = "nvidia-smi-q-x_h100-80gb-hbm3-x8_hgx_drv580.105.08_fabric-zero-uuid.xml"
LOST = "MOCK_nvidia-smi-q-x_gb200-profile_gpu1-lost.xml"
ECC = "MOCK_nvidia-smi-q-x_gb200-profile_gpu0-ecc-dram-uncorrectable.xml"


def entries_of(name: str, listing: str | None = None) -> tuple[list[dict], list[str]]:
    cards, problems = G.cards_from_smi(smi.parse_xml(read(name)))
    if listing:
        problems += G.apply_listing(cards, smi.parse_list(read(listing)))
    out, more = G.entries(cards)
    return out, problems + more


def text_entries(name: str) -> list[dict]:
    cards, _ = G.cards_from_smi(smi.parse_text(read(name)))
    return G.entries(cards)[0]


CLASSES = {
    "nvidia-smi-q-x_a100-sxm4-40gb-single_drv570.148.08.xml": ["a100-40g"],
    GB200: ["gb200-185g"] * 4,
    H100: ["h100-80g"] * 8,
    "nvidia-smi-q-x_quadro-p2000_drv525.125.06.xml": ["p2000-5g"],
    "nvidia-smi-q-x_rtx-a5000-x2_drv590.44.01.xml": ["rtx-a5000-24g"] * 2,
    "nvidia-smi-q-x_rtx-pro-6000-blackwell-maxq_drv590.44.01.xml": ["rtx-pro-6000-blackwell-96g"],
    "nvidia-smi-q-x_rtx3080_drv595.58.03_v13-full-fabric-block.xml": ["rtx-3080-10g"],
    "nvidia-smi-q-x_tesla-t4-single_aws-g4dn_drv595.91.07.xml": ["t4-15g"],
    "nvidia-smi-q-x_tesla-t4_drv515.105.01.xml": ["t4-15g"],
    ECC: ["gb200-192g"] * 2,
    LOST: ["gb200-192g", None],  # the lost card's memory is unknown, so is its class
    MIG_XML: ["a100-80g-mig-1g.20gb"] * 4,
}


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_classes_of_every_xml_capture(name):
    assert [e.get("class") for e in entries_of(name)[0]] == CLASSES[name]


TEXT_CLASSES = {
    "nvidia-smi-q_a10-single_drv535.129.03.txt": "a10-22g",
    "nvidia-smi-q_h100-80gb-hbm3-x8_drv535.161.08.txt": "h100-80g",
    "nvidia-smi-q_h100-80gb-hbm3-x8_drv535.183.01_fabric-completed.txt": "h100-80g",
    "nvidia-smi-q_h200-single_drv550.90.12_fabric-completed.txt": "h200-140g",
    "nvidia-smi-q_rtx4090-x8_drv535.154.05.txt": "rtx-4090-24g",
    "nvidia-smi-q_titan-v-single_drv560.35.03.txt": "titan-v-12g",
}


@pytest.mark.parametrize("name", sorted(TEXT_CLASSES))
def test_classes_of_every_text_capture(name):
    assert {e["class"] for e in text_entries(name)} == {TEXT_CLASSES[name]}


@pytest.mark.parametrize(
    ("product", "model"),
    [
        ("NVIDIA A100-SXM4-80GB", "a100"),
        ("NVIDIA A100 80GB PCIe", "a100"),
        ("NVIDIA A100-PCIE-40GB", "a100"),
        ("NVIDIA H100 80GB HBM3", "h100"),
        ("NVIDIA H100 PCIe", "h100"),
        ("NVIDIA H100 NVL", "h100-nvl"),
        ("NVIDIA GeForce RTX 4090", "rtx-4090"),
        ("NVIDIA RTX A5000", "rtx-a5000"),
        ("Tesla V100-SXM2-16GB", "v100"),
        ("NVIDIA GH200 96GB HBM3", "gh200"),
        ("NVIDIA GB200", "gb200"),
        ("NVIDIA RTX 6000 Ada Generation", "rtx-6000-ada"),
        ("Quadro RTX 8000", "rtx-8000"),
        ("NVIDIA L40S", "l40s"),
        ("N/A", None),
        ("", None),
    ],
)
def test_model_part(product, model):
    assert G.model_part(product) == model


def test_gb200_memory_rounds_to_185():
    assert G.gpu_class("NVIDIA GB200", 189471) == "gb200-185g"
    assert G.gpu_class("NVIDIA GB200", None) is None


# --- fabric ---------------------------------------------------------------------------------------------------------


def test_gb200_cards_joined_one_domain():
    gpus, _ = entries_of(GB200)
    assert {fabric_facts.joined_domain(e["fabric"]) for e in gpus} == {("00000001-0000-0000-0000-000000000001", 2)}
    fabric = gpus[0]["fabric"]
    assert fabric["health_summary"] == "Healthy"
    assert fabric["bandwidth"] == "Full" and fabric["degraded"] is False
    assert fabric["problems"] == []


def test_h100_hgx_zero_uuid_is_no_domain():
    gpus, _ = entries_of(H100)
    for e in gpus:
        assert e["fabric"]["state"] == "Completed" and e["fabric"]["status"] == "Success"
        assert e["fabric"]["cluster_uuid"] == G.ZERO_UUID and e["fabric"]["clique_id"] == 0
        assert fabric_facts.joined_domain(e["fabric"]) is None
        assert "bandwidth" not in e["fabric"]  # N/A in the capture: unknown


@pytest.mark.parametrize(
    "name",
    ["nvidia-smi-q-x_rtx3080_drv595.58.03_v13-full-fabric-block.xml", "nvidia-smi-q-x_quadro-p2000_drv525.125.06.xml"],
)
def test_cards_without_fabric_say_not_supported(name):
    assert entries_of(name)[0][0]["fabric"] == {"state": "Not Supported"}


def test_pre_fabric_driver_leaves_fabric_unknown():
    assert "fabric" not in entries_of("nvidia-smi-q-x_tesla-t4_drv515.105.01.xml")[0][0]


def test_unhealthy_fragment_is_joined_but_flagged():
    facts = fabric_facts.fabric_from_smi(
        smi.parse_fabric_block(read("FRAGMENT_nvidia-smi-q_grep-fabric_gb200_unhealthy-summary.txt"))
    )
    report = fabric_facts.fabric_report(facts)
    assert fabric_facts.joined_domain(report) == ("dc6e40c4-d722-4357-9ba6-5291dd461278", 2)
    assert report["degraded"] is False
    assert report["problems"] == ["fabric health: Unhealthy"]


def test_insufficient_resources_fragment_joins_nothing():
    facts = fabric_facts.fabric_from_smi(
        smi.parse_fabric_block(read("FRAGMENT_nvidia-smi-q_fabric_insufficient-resources.txt"))
    )
    report = fabric_facts.fabric_report(facts)
    assert fabric_facts.joined_domain(report) is None
    assert report["problems"] == ["fabric registration failed: Insufficient Resources"]


def test_degraded_bandwidth_is_joined_but_degraded():
    raw = {
        "state": "Completed",
        "status": "Success",
        "clique_id": "7",
        "cluster_uuid": "dc6e40c4-d722-4357-9ba6-5291dd461278",
    }
    report = fabric_facts.fabric_report(
        fabric_facts.fabric_from_smi({**raw, "bandwidth": "Degraded", "route_unhealthy": "True"})
    )
    assert fabric_facts.joined_domain(report) == ("dc6e40c4-d722-4357-9ba6-5291dd461278", 7)
    assert report["degraded"] is True
    assert report["problems"] == ["fabric bandwidth degraded", "fabric route unhealthy"]


@pytest.mark.parametrize("state", ["In Progress", "Not Started"])
def test_unfinished_registration_joins_nothing(state):
    report = fabric_facts.fabric_report(fabric_facts.fabric_from_smi({"state": state, "status": "N/A"}))
    assert fabric_facts.joined_domain(report) is None
    assert report["problems"] == [f"fabric registration {state.lower()}"]


def test_joined_domain_needs_success():
    assert (
        fabric_facts.joined_domain({"state": "Completed", "status": "Failure", "cluster_uuid": "ab-1", "clique_id": 1})
        is None
    )
    assert fabric_facts.joined_domain(None) is None


# --- MIG ------------------------------------------------------------------------------------------------------------


def test_a100_mig_card_is_reported_as_its_instances():
    gpus, problems = entries_of(MIG_XML)
    assert [e["index"] for e in gpus] == [1000, 1001, 1002, 1003]
    assert [e["label"] for e in gpus] == ["0/mig0", "0/mig1", "0/mig2", "0/mig3"]
    for e in gpus:
        assert e["parent"] == 0
        assert e["parent_uuid"] == "GPU-513536b6-7d19-9063-b049-1e69664bb298"
        assert e["mig_profile"] == "1g.20gb" and e["memory_mb"] == 19968
        assert e["mig_mode"] == "enabled"
        assert "uuid" not in e  # -q -x has no MIG UUID: unknown, not the card's
        for absent in ("utilization_pct", "temperature_c", "power_w", "fabric"):
            assert absent not in e
    assert [e["gpu_instance_id"] for e in gpus] == [3, 4, 5, 6]
    assert not any("MIG profile unknown" in p for p in problems)


def test_listing_adds_mig_uuids_and_profiles():
    cards, _ = G.cards_from_smi(smi.parse_xml(read(MIG_XML)))
    listing = smi.parse_list(
        "GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-513536b6-7d19-9063-b049-1e69664bb298)\n"
        + "".join(f"  MIG 1g.20gb Device {i}: (UUID: MIG-000{i})\n" for i in range(4))
    )
    assert G.apply_listing(cards, listing) == []
    gpus, problems = G.entries(cards)
    assert [e["uuid"] for e in gpus] == ["MIG-0000", "MIG-0001", "MIG-0002", "MIG-0003"]
    assert gpus[2]["mig_uuid"] == "MIG-0002"
    assert problems == []


def test_listing_alone_gh200():
    cards = G.cards_from_listing(smi.parse_list(read("nvidia-smi-L_gh200-96gb-x2_mig-7x1g.12gb_yaml-comment.txt")))
    gpus, _ = G.entries(cards)
    assert len(gpus) == 14
    assert [e["index"] for e in gpus[:2]] == [1000, 1001] and gpus[7]["index"] == 1100
    assert gpus[13]["label"] == "1/mig6"
    assert gpus[13]["uuid"] == "MIG-c7cbc24b-a93f-5ff3-b388-deba1f3ac17e"
    assert gpus[0]["mig_profile"] == "1g.12gb"
    assert "class" not in gpus[0]  # card memory unknown from -L alone


def test_mig_enabled_without_instances_is_the_card_with_a_reason():
    cards, _ = G.cards_from_smi(smi.parse_xml(read(MIG_XML)))
    cards[0].migs = []
    gpus, _ = G.entries(cards)
    assert len(gpus) == 1 and gpus[0]["index"] == 0
    assert gpus[0]["class"] == "a100-80g"
    assert gpus[0]["health"] == ["MIG enabled but no instances created"]


@pytest.mark.parametrize(
    ("name", "card_mib", "sm", "mib", "ce", "ofa", "profile"),
    [
        ("NVIDIA A100-SXM4-80GB", 81920, 14, 9728, 1, 0, "1g.10gb"),
        ("NVIDIA A100-SXM4-80GB", 81920, 14, 9728, 1, 1, "1g.10gb+me"),
        ("NVIDIA A100-SXM4-80GB", 81920, 14, 19968, 1, 0, "1g.20gb"),
        ("NVIDIA A100-SXM4-80GB", 81920, 42, 40192, 3, 0, "3g.40gb"),
        ("NVIDIA A100-SXM4-80GB", 81920, 98, 80640, 7, 1, "7g.80gb"),
        ("NVIDIA A100-SXM4-40GB", 40960, 14, 4864, 1, 0, "1g.5gb"),
        ("NVIDIA A100-SXM4-40GB", 40960, 42, 20096, 3, 0, "3g.20gb"),
        ("NVIDIA H100 80GB HBM3", 81559, 16, 9984, 1, 0, "1g.10gb"),
        ("NVIDIA H100 80GB HBM3", 81559, 26, 20096, 1, 0, "1g.20gb"),
        ("NVIDIA H100 80GB HBM3", 81559, 60, 40448, 3, 0, "3g.40gb"),
        ("NVIDIA GH200 96GB HBM3", 97871, 16, 11776, 1, 0, "1g.12gb"),
        # a 1-slice compute instance inside a 2-slice GPU instance: not a whole profile
        ("NVIDIA A100-SXM4-80GB", 81920, 14, 19968, 2, 0, None),
        # chips whose shapes we do not know are left alone
        ("NVIDIA H200", 143771, 16, 18176, 1, 0, None),
        ("NVIDIA B200", 183359, 18, 23040, 1, 0, None),
    ],
)
def test_mig_profile_derivation(name, card_mib, sm, mib, ce, ofa, profile):
    mig = G.MigFacts(device=0, sm_count=sm, memory_mib=mib, copy_engines=ce, ofa=ofa)
    assert G.derive_mig_profile(name, card_mib, mig) == profile


def test_unknown_profile_is_a_problem_not_a_guess():
    cards, _ = G.cards_from_smi(smi.parse_xml(read(MIG_XML)))
    cards[0].migs[0] = dataclasses.replace(cards[0].migs[0], sm_count=15)
    gpus, problems = G.entries(cards)
    assert "mig_profile" not in gpus[0] and "class" not in gpus[0]
    assert problems == [
        "gpu 0/mig0: MIG profile unknown (the source does not name it and its SM and memory counts match no known "
        "profile; give nvidia-smi -L)"
    ]


# --- health ---------------------------------------------------------------------------------------------------------


def test_lost_gpu():
    gpus, problems = entries_of(LOST)
    lost = gpus[1]
    assert lost["health"] == ["GPU is lost"]
    assert lost["uuid"] == "GPU-b200b200-0000-0000-0000-000000000001"
    for unknown in ("memory_mb", "class", "fabric", "temperature_c", "power_w", "utilization_pct", "nvlink_peers"):
        assert unknown not in lost
    assert problems == ["gpu 1: nvidia-smi: GPU is lost"]


def test_ecc_and_row_remap_failure():
    gpus, _ = entries_of(ECC)
    assert gpus[0]["health"] == [
        "row remapping failed (the GPU needs service)",
        "5 uncorrectable ECC errors since the last reset",
    ]
    assert gpus[1]["health"] == []


def test_healthy_cards_report_an_empty_health_list():
    gpus, _ = entries_of(H100)
    assert all(e["health"] == [] for e in gpus)


def test_retired_pages_from_a_page_retirement_query():
    gpus = text_entries("UPSTREAM-EDITED_nvidia-smi-q-d-PAGE_RETIREMENT_x8_retired-pages-nonzero.txt")
    assert gpus[0]["health"] == [
        "65 retired pages (60 single-bit, 5 double-bit): NVIDIA's limit of 64 reached (the GPU needs service)"
    ]
    # 63 pages retired and settled are the card's history (retired_pages), not a fault; the pending one is.
    assert gpus[1]["health"] == ["retired pages pending (reset the GPU)"]
    assert gpus[1]["retired_pages"] == {"single_bit": 2, "double_bit": 61, "pending": True}
    assert gpus[2]["health"] == []
    clean = text_entries("nvidia-smi-q-d-PAGE_RETIREMENT_x8-azure-vm_drv535.86.10_clean.txt")
    assert all(e["health"] == [] for e in clean)


def test_pending_row_remap_on_the_a10():
    assert text_entries("nvidia-smi-q_a10-single_drv535.129.03.txt")[0]["health"] == [
        "row remapping pending (reset the GPU)"
    ]


def test_text_and_xml_agree_on_the_h100_fabric():
    gpus = text_entries("nvidia-smi-q_h100-80gb-hbm3-x8_drv535.183.01_fabric-completed.txt")
    # 535 prints state and status only: completed, no domain facts at all
    assert [e["fabric"] for e in gpus] == [{"state": "Completed", "status": "Success", "problems": []}] * 8
    assert all(fabric_facts.joined_domain(e["fabric"]) is None for e in gpus)


def test_topology_fills_peers_nics_and_numa():
    from agent.discovery.topo import parse_topo

    cards, _ = G.cards_from_smi(smi.parse_xml(read(H100)))
    assert G.apply_topology(cards, parse_topo(read("nvidia-smi-topo-m_h100-x8_8nics-mlx5_sglang-issue.txt"))) == []
    gpus, _ = G.entries(cards)
    assert gpus[3]["nvlink_peers"] == [0, 1, 2, 4, 5, 6, 7]
    assert gpus[3]["nics"]["mlx5_3"] == "PIX"
    assert [e["numa"] for e in gpus] == [0, 0, 0, 0, 1, 1, 1, 1]


def test_topology_from_another_machine_is_not_applied():
    from agent.discovery.topo import parse_topo

    cards, _ = G.cards_from_smi(smi.parse_xml(read(GB200)))
    problems = G.apply_topology(cards, parse_topo(read("nvidia-smi-topo-m_h100-x8_8nics-mlx5_sglang-issue.txt")))
    assert problems == ["nvidia-smi topo -m lists 8 GPUs but the GPU source 4: topology not used"]
    assert all(c.nics is None for c in cards)


# --- Xid ------------------------------------------------------------------------------------------------------------


def test_xid_119_lands_on_the_card_at_that_pci_address():
    events = xid_log.parse_xid_log(read("dmesg_xid-119_gsp-rpc-timeout_h100.log"))
    assert {(e.domain, e.bus, e.device, e.xid) for e in events} == {(0, 0x9B, 0, 119)}
    cards = [G.CardFacts(index=i, pci_bus=f"00000000:{bus}:00.0") for i, bus in enumerate(["18", "9B"])]
    assert xid_log.apply_xids(cards, events) == []
    gpus, _ = G.entries(cards)
    assert gpus[0]["health"] == []
    (problem,) = gpus[1]["health"]
    assert problem.startswith(f"Xid 119 ({len(events)} times) in the kernel log, last: Timeout after 6s")


def test_xid_for_an_unknown_address_is_a_problem():
    events = xid_log.parse_xid_log("[1.0] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus.")
    assert xid_log.apply_xids([], events) == ["Xid 79 on PCI 0000:3b:00, no such GPU"]
