"""nvidia-smi parsers against the real captures: -q -x, plain -q, -L and fabric fragments."""

from __future__ import annotations

import pytest

from agent.discovery import nvidia_smi as smi
from agent.discovery.errors import DiscoveryError
from tests.captures import all_captures, read

XML = {
    "nvidia-smi-q-x_a100-sxm4-40gb-single_drv570.148.08.xml": (1, "NVIDIA A100-SXM4-40GB", "40960 MiB"),
    "nvidia-smi-q-x_a100-sxm4-80gb_mig-enabled_drv535.54.03.xml": (1, "NVIDIA A100-SXM4-80GB", "81920 MiB"),
    "nvidia-smi-q-x_gb200-x4_p6e-gb200_drv580.173.02_fabric-completed-healthy.xml": (4, "NVIDIA GB200", "189471 MiB"),
    "nvidia-smi-q-x_h100-80gb-hbm3-x8_hgx_drv580.105.08_fabric-zero-uuid.xml": (
        8,
        "NVIDIA H100 80GB HBM3",
        "81559 MiB",
    ),
    "nvidia-smi-q-x_quadro-p2000_drv525.125.06.xml": (1, "Quadro P2000", "5120 MiB"),
    "nvidia-smi-q-x_rtx-a5000-x2_drv590.44.01.xml": (2, "NVIDIA RTX A5000", "24564 MiB"),
    "nvidia-smi-q-x_rtx-pro-6000-blackwell-maxq_drv590.44.01.xml": (
        1,
        "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition",
        "97887 MiB",
    ),
    "nvidia-smi-q-x_rtx3080_drv595.58.03_v13-full-fabric-block.xml": (1, "NVIDIA GeForce RTX 3080", "10240 MiB"),
    "nvidia-smi-q-x_tesla-t4-single_aws-g4dn_drv595.91.07.xml": (1, "Tesla T4", "15360 MiB"),
    "nvidia-smi-q-x_tesla-t4_drv515.105.01.xml": (1, "Tesla T4", "15360 MiB"),
    "MOCK_nvidia-smi-q-x_gb200-profile_gpu0-ecc-dram-uncorrectable.xml": (2, "NVIDIA GB200", "196608 MiB"),
    "MOCK_nvidia-smi-q-x_gb200-profile_gpu1-lost.xml": (2, "NVIDIA GB200", "196608 MiB"),
}


def test_every_xml_capture_is_covered():
    names = {p.name for p in all_captures(suffix=".xml")}
    assert names == set(XML)


@pytest.mark.parametrize("name", sorted(XML))
def test_xml_counts_names_memory(name):
    count, product, memory = XML[name]
    log = smi.parse_xml(read(name))
    assert len(log.gpus) == count
    assert log.gpus[0].name == product
    assert log.gpus[0].memory_total == memory
    assert log.driver_version and log.cuda_version
    assert all(g.uuid and g.uuid.startswith("GPU-") for g in log.gpus)
    assert all(smi.normalize_bus_id(g.pci_bus_id) for g in log.gpus)


def test_xml_mig_devices_of_the_a100():
    gpu = smi.parse_xml(read("nvidia-smi-q-x_a100-sxm4-80gb_mig-enabled_drv535.54.03.xml")).gpus[0]
    assert (gpu.mig_current, gpu.mig_pending) == ("Enabled", "Enabled")
    assert [d.index for d in gpu.mig_devices] == [0, 1, 2, 3]
    assert [d.gpu_instance_id for d in gpu.mig_devices] == ["3", "4", "5", "6"]
    assert {(d.sm_count, d.memory_total, d.copy_engines, d.ofa) for d in gpu.mig_devices} == {
        ("14", "19968 MiB", "1", "0")
    }


def test_xml_mig_devices_none_is_an_empty_list():
    gpu = smi.parse_xml(read("nvidia-smi-q-x_gb200-x4_p6e-gb200_drv580.173.02_fabric-completed-healthy.xml")).gpus[0]
    assert gpu.mig_devices == []


def test_xml_fabric_blocks():
    gb200 = smi.parse_xml(read("nvidia-smi-q-x_gb200-x4_p6e-gb200_drv580.173.02_fabric-completed-healthy.xml"))
    assert gb200.gpus[0].fabric["cluster_uuid"] == "00000001-0000-0000-0000-000000000001"
    assert gb200.gpus[0].fabric["clique_id"] == "2"
    assert gb200.gpus[0].fabric["summary"] == "Healthy"
    h100 = smi.parse_xml(read("nvidia-smi-q-x_h100-80gb-hbm3-x8_hgx_drv580.105.08_fabric-zero-uuid.xml"))
    assert {g.fabric["cluster_uuid"] for g in h100.gpus} == {"00000000-0000-0000-0000-000000000000"}
    old = smi.parse_xml(read("nvidia-smi-q-x_tesla-t4_drv515.105.01.xml"))
    assert old.gpus[0].fabric is None  # pre-fabric schema: unknown, not "not supported"


def test_xml_lost_gpu_and_ecc():
    lost = smi.parse_xml(read("MOCK_nvidia-smi-q-x_gb200-profile_gpu1-lost.xml"))
    assert [g.lost for g in lost.gpus] == [False, True]
    assert lost.gpus[1].memory_total == "GPU is lost"
    ecc = smi.parse_xml(read("MOCK_nvidia-smi-q-x_gb200-profile_gpu0-ecc-dram-uncorrectable.xml"))
    assert "5" in ecc.gpus[0].ecc_volatile_uncorrectable
    assert ecc.gpus[0].remap_failure == "Yes"


def test_xml_old_power_tag_and_new_instant_reading():
    assert smi.parse_xml(read("nvidia-smi-q-x_tesla-t4_drv515.105.01.xml")).gpus[0].power_draw == "26.78 W"
    assert smi.parse_xml(read("nvidia-smi-q-x_rtx3080_drv595.58.03_v13-full-fabric-block.xml")).gpus[0].power_draw == (
        "142.33 W"
    )


def test_xml_processes_counted_with_their_instances():
    t4 = smi.parse_xml(read("nvidia-smi-q-x_tesla-t4_drv515.105.01.xml")).gpus[0]
    assert [p.pid for p in t4.processes] == ["675", "5762"]


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("", "empty"),
        ("<nvidia_smi_log><gpu>", "not valid XML"),
        ("<other/>", "expected <nvidia_smi_log>"),
    ],
)
def test_xml_errors_are_sentences(text, words):
    with pytest.raises(DiscoveryError, match=words):
        smi.parse_xml(text)


def test_truncated_xml_names_the_line():
    text = read("nvidia-smi-q-x_a100-sxm4-80gb_mig-enabled_drv535.54.03.xml")
    with pytest.raises(DiscoveryError, match=r"not valid XML: .*line \d+"):
        smi.parse_xml(text[: len(text) // 2])


TEXT = {
    "nvidia-smi-q_a10-single_drv535.129.03.txt": (1, "NVIDIA A10", "23028 MiB"),
    "nvidia-smi-q_h100-80gb-hbm3-x8_drv535.161.08.txt": (8, "NVIDIA H100 80GB HBM3", "81559 MiB"),
    "nvidia-smi-q_h100-80gb-hbm3-x8_drv535.183.01_fabric-completed.txt": (8, "NVIDIA H100 80GB HBM3", "81559 MiB"),
    "nvidia-smi-q_h200-single_drv550.90.12_fabric-completed.txt": (1, "NVIDIA H200", "143771 MiB"),
    "nvidia-smi-q_rtx4090-x8_drv535.154.05.txt": (8, "NVIDIA GeForce RTX 4090", "24564 MiB"),
    "nvidia-smi-q_titan-v-single_drv560.35.03.txt": (1, "NVIDIA TITAN V", "12288 MiB"),
}


@pytest.mark.parametrize("name", sorted(TEXT))
def test_text_counts_names_memory(name):
    count, product, memory = TEXT[name]
    log = smi.parse_text(read(name))
    assert len(log.gpus) == log.attached_gpus == count
    assert {g.name for g in log.gpus} == {product}
    assert {g.memory_total for g in log.gpus} == {memory}
    assert all(g.uuid.startswith("GPU-") for g in log.gpus)
    assert all(smi.normalize_bus_id(g.pci_bus_id) for g in log.gpus)


def test_text_facts_of_the_h200():
    gpu = smi.parse_text(read("nvidia-smi-q_h200-single_drv550.90.12_fabric-completed.txt")).gpus[0]
    assert gpu.pci_bus_id == "00000000:03:00.0"
    assert gpu.uuid == "GPU-cb3dfa52-e2f3-9ca4-a399-7d16041c3732"
    assert gpu.fabric == {
        "state": "Completed",
        "status": "Success",
        "clique_id": "0",
        "cluster_uuid": "00000000-0000-0000-0000-000000000000",
        "bandwidth": "N/A",
    }
    assert (gpu.mig_current, gpu.mig_pending) == ("Disabled", "Disabled")
    assert (gpu.remap_pending, gpu.remap_failure) == ("No", "No")
    assert gpu.retired_pending == "N/A"
    assert gpu.power_draw == "74.58 W"


def test_text_a10_has_a_pending_row_remap():
    gpu = smi.parse_text(read("nvidia-smi-q_a10-single_drv535.129.03.txt")).gpus[0]
    assert gpu.remap_pending == "Yes"


def test_text_processes():
    log = smi.parse_text(read("nvidia-smi-q_rtx4090-x8_drv535.154.05.txt"))
    assert log.gpus[0].processes[0].pid == "58130"


def test_text_page_retirement_query():
    log = smi.parse_text(read("UPSTREAM-EDITED_nvidia-smi-q-d-PAGE_RETIREMENT_x8_retired-pages-nonzero.txt"))
    assert len(log.gpus) == 8
    assert (log.gpus[0].retired_sbe, log.gpus[0].retired_dbe, log.gpus[0].retired_pending) == ("60", "5", "No")
    assert log.gpus[1].retired_pending == "Yes"
    assert log.gpus[0].name is None  # a -d query says nothing else


def test_truncated_text_is_a_clear_error():
    with pytest.raises(DiscoveryError, match="truncated or damaged: it says 8 GPUs are attached but holds 1"):
        smi.parse_text(read("nvidia-smi-q_h100_drv535.183.01_truncated-invalid.txt"))


def test_text_that_is_not_a_log():
    with pytest.raises(DiscoveryError):
        smi.parse_text("hello\nworld\n")


def test_fabric_fragments():
    unhealthy = smi.parse_fabric_block(read("FRAGMENT_nvidia-smi-q_grep-fabric_gb200_unhealthy-summary.txt"))
    assert unhealthy["summary"] == "Unhealthy"
    assert unhealthy["cluster_uuid"] == "dc6e40c4-d722-4357-9ba6-5291dd461278"
    failed = smi.parse_fabric_block(read("FRAGMENT_nvidia-smi-q_fabric_insufficient-resources.txt"))
    assert failed["status"] == "Insufficient Resources"


def test_list_with_mig_in_a_yaml_comment():
    listing = smi.parse_list(read("nvidia-smi-L_gh200-96gb-x2_mig-7x1g.12gb_yaml-comment.txt"))
    assert [g.index for g in listing.gpus] == [0, 1]
    assert listing.gpus[0].name == "NVIDIA GH200 96GB HBM3"
    assert listing.gpus[1].uuid == "GPU-9e6df7cb-64d4-5e53-2b1d-cee9e58aeb94"
    assert [m.device for m in listing.gpus[0].migs] == list(range(7))
    assert {m.profile for g in listing.gpus for m in g.migs} == {"1g.12gb"}
    assert listing.gpus[0].migs[0].uuid == "MIG-4d806f22-346a-5a1d-ac01-86b505cdf485"


def test_list_plain_and_old_mig_uuid_form():
    listing = smi.parse_list(
        "GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-aaaa)\n"
        "  MIG 3g.20gb Device 0: (UUID: MIG-GPU-aaaa/1/0)\n"
        "GPU 1: Tesla T4 (UUID: GPU-bbbb)\n"
    )
    assert listing.gpus[0].migs[0].uuid == "MIG-GPU-aaaa/1/0"
    assert listing.gpus[1].migs == []


@pytest.mark.parametrize("text", ["", "  MIG 1g.5gb Device 0: (UUID: MIG-x)\nGPU 0: A (UUID: GPU-y)", "nothing here"])
def test_list_errors(text):
    with pytest.raises(DiscoveryError):
        smi.parse_list(text)


@pytest.mark.parametrize(
    ("raw", "bus"),
    [
        ("0000:0A:00.0", "00000000:0A:00.0"),
        ("00000000:18:00.0", "00000000:18:00.0"),
        ("0000:9b:00.0", "00000000:9B:00.0"),
    ],
)
def test_bus_ids_are_normalised(raw, bus):
    assert smi.normalize_bus_id(raw) == bus


MIG_TEXT = """==============NVSMI LOG==============

Driver Version                            : 535.54.03
Attached GPUs                             : 1
GPU 00000000:01:00.0
    Product Name                          : NVIDIA A100-SXM4-80GB
    MIG Mode
        Current                           : Enabled
        Pending                           : Enabled
    MIG Devices
        MIG Device
            Index                         : 0
            GPU Instance ID               : 3
            Compute Instance ID           : 0
            Device Attributes
                Shared
                    Multiprocessor count  : 14
                    Copy Engine count     : 1
                    Encoder count         : 0
                    Decoder count         : 1
                    OFA count             : 0
                    JPG count             : 0
            ECC Errors
                Volatile
                    SRAM Uncorrectable    : 0
            FB Memory Usage
                Total                     : 19968 MiB
    GPU UUID                              : GPU-513536b6-7d19-9063-b049-1e69664bb298
    FB Memory Usage
        Total                             : 81920 MiB
"""


def test_text_mig_devices_read_like_the_xml():
    gpu = smi.parse_text(MIG_TEXT).gpus[0]
    xml = smi.parse_xml(read("nvidia-smi-q-x_a100-sxm4-80gb_mig-enabled_drv535.54.03.xml")).gpus[0]
    assert gpu.memory_total == "81920 MiB"  # the card's, not the instance's
    assert gpu.mig_devices == xml.mig_devices[:1]
