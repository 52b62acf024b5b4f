"""The NVML path: FakeNvml answers as the driver did, and NVML over a capture equals nvidia-smi over it."""

from __future__ import annotations

import pynvml
import pytest

from agent.discovery import fabric_facts
from agent.discovery import gpus as G
from agent.discovery import nvidia_smi as smi
from agent.discovery import nvml as N
from agent.discovery.nvml_fake import FakeNvml
from agent.discovery.topo import parse_topo
from tests.captures import all_captures, read

GB200 = "nvidia-smi-q-x_gb200-x4_p6e-gb200_drv580.173.02_fabric-completed-healthy.xml"
H100 = "nvidia-smi-q-x_h100-80gb-hbm3-x8_hgx_drv580.105.08_fabric-zero-uuid.xml"
LOST = "MOCK_nvidia-smi-q-x_gb200-profile_gpu1-lost.xml"
MIG_XML = "nvidia-smi-q-x_a100-sxm4-80gb_mig-enabled_drv535.54.03.xml"
TOPO = "nvidia-smi-topo-m_h100-x8_8nics-mlx5_sglang-issue.txt"
XML_CAPTURES = [p.name for p in all_captures(suffix=".xml")]


def smi_path(log: smi.SmiLog, topo=None) -> list[dict]:
    cards, _ = G.cards_from_smi(log)
    if topo is not None:
        G.apply_topology(cards, topo)
    return G.entries(cards)[0]


def nvml_path(api: N.NvmlApi, topo=None) -> tuple[list[dict], list[str]]:
    reading = N.read_cards(api)
    if topo is not None:
        G.apply_topology(reading.cards, topo)
    return G.entries(reading.cards)[0], reading.problems


@pytest.mark.parametrize("name", XML_CAPTURES)
def test_nvml_over_the_capture_equals_nvidia_smi(name):
    log = smi.parse_xml(read(name))
    assert nvml_path(FakeNvml(log))[0] == smi_path(log)


def test_the_same_with_topology():
    log, topo = smi.parse_xml(read(H100)), parse_topo(read(TOPO))
    assert nvml_path(FakeNvml(log), topo)[0] == smi_path(log, topo)


def test_the_same_with_a_listing():
    log = smi.parse_xml(read(MIG_XML))
    listing = smi.parse_list(
        "GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-513536b6-7d19-9063-b049-1e69664bb298)\n"
        + "".join(f"  MIG 1g.20gb Device {i}: (UUID: MIG-000{i})\n" for i in range(4))
    )
    cards, _ = G.cards_from_smi(log)
    G.apply_listing(cards, listing)
    via_nvml = nvml_path(FakeNvml(log, listing))[0]
    assert via_nvml == G.entries(cards)[0]
    assert via_nvml[3]["uuid"] == "MIG-0003"


def test_fake_raises_what_nvml_would():
    fake = FakeNvml(smi.parse_xml(read(LOST)))
    lost = fake.handle(1)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        fake.memory_total_mib(lost)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        fake.fabric_info(lost)
    assert fake.memory_total_mib(fake.handle(0)) == 196608
    rtx = FakeNvml(smi.parse_xml(read("nvidia-smi-q-x_rtx3080_drv595.58.03_v13-full-fabric-block.xml")))
    with pytest.raises(pynvml.NVMLError_NotSupported):
        rtx.fabric_info(rtx.handle(0))
    with pytest.raises(pynvml.NVMLError_NotSupported):
        rtx.mig_mode(rtx.handle(0))
    old = FakeNvml(smi.parse_xml(read("nvidia-smi-q-x_tesla-t4_drv515.105.01.xml")))
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        old.fabric_info(old.handle(0))
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        old.handle(1)


def test_fake_fabric_struct_of_the_gb200():
    fake = FakeNvml(smi.parse_xml(read(GB200)))
    info = fake.fabric_info(fake.handle(0))
    assert (info.state, info.status, info.clique_id) == (pynvml.NVML_GPU_FABRIC_STATE_COMPLETED, pynvml.NVML_SUCCESS, 2)
    assert info.cluster_uuid == bytes.fromhex("00000001000000000000000000000001")
    assert info.health_summary == pynvml.NVML_GPU_FABRIC_HEALTH_SUMMARY_HEALTHY
    assert info.health_mask & 0x3 == pynvml.NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_FALSE
    assert (info.health_mask >> 4) & 0x3 == pynvml.NVML_GPU_FABRIC_HEALTH_MASK_ROUTE_UNHEALTHY_FALSE


def test_health_mask_bits_decode_as_in_nvml_h():
    mask = (
        pynvml.NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_TRUE << pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_DEGRADED_BW
        | pynvml.NVML_GPU_FABRIC_HEALTH_MASK_ROUTE_RECOVERY_TRUE
        << pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_RECOVERY
        | pynvml.NVML_GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION_INSUFFICIENT_NVLINKS
        << pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_INCORRECT_CONFIGURATION
        | pynvml.NVML_GPU_FABRIC_HEALTH_MASK_PARTITION_ASSIGNED_TRUE
        << pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_PARTITION_ASSIGNED
        | pynvml.NVML_GPU_FABRIC_HEALTH_MASK_GFM_STATE_DISCONNECTED
        << pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_GFM_STATE
    )
    info = N.FabricInfo(
        state=pynvml.NVML_GPU_FABRIC_STATE_COMPLETED,
        status=pynvml.NVML_SUCCESS,
        cluster_uuid=bytes.fromhex("dc6e40c4d72243579ba65291dd461278"),
        clique_id=32766,
        health_mask=mask,
        health_summary=pynvml.NVML_GPU_FABRIC_HEALTH_SUMMARY_LIMITED_CAPACITY,
    )
    report = fabric_facts.fabric_report(N.fabric_from_nvml(info))
    assert fabric_facts.joined_domain(report) == ("dc6e40c4-d722-4357-9ba6-5291dd461278", 32766)
    assert report["bandwidth"] == "Degraded" and report["degraded"] is True
    assert report["health_summary"] == "Limited Capacity"
    assert report["problems"] == [
        "fabric health: Limited Capacity",
        "fabric bandwidth degraded",
        "fabric route recovery in progress",
        "fabric configuration incorrect: Insufficient NVLinks",
        "fabric manager disconnected",
    ]


def test_fabric_status_failure_from_nvml():
    info = N.FabricInfo(3, pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES, bytes(16), 0)
    report = fabric_facts.fabric_report(N.fabric_from_nvml(info))
    assert report["status"] == "Insufficient Resources"
    assert report["problems"] == ["fabric registration failed: Insufficient Resources"]
    assert "bandwidth" not in report  # a v1 struct has no health mask: unknown


class CardThreeLost(FakeNvml):
    """The H100 capture, but the driver loses card 3 half way through reading it."""

    def temperature_c(self, handle):
        if getattr(handle, "index", None) == 3:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return super().temperature_c(handle)


def test_one_card_lost_mid_read_keeps_what_was_read():
    gpus, problems = nvml_path(CardThreeLost(smi.parse_xml(read(H100))))
    assert problems == ["gpu 3: NVML: GPU is lost"]
    card = gpus[3]
    assert card["health"] == ["GPU is lost"]
    assert card["class"] == "h100-80g" and card["uuid"] == "GPU-00000003-0000-0000-0000-000000000003"
    assert "temperature_c" not in card
    assert all(e["health"] == [] for i, e in enumerate(gpus) if i != 3)


class AllPeers(FakeNvml):
    def nvlink_p2p(self, handle, other):
        return True


def test_nvlink_peers_from_p2p_status():
    gpus, _ = nvml_path(AllPeers(smi.parse_xml(read(H100))))
    assert gpus[0]["nvlink_peers"] == [1, 2, 3, 4, 5, 6, 7]
    assert gpus[7]["nvlink_peers"] == [0, 1, 2, 3, 4, 5, 6]


def test_nvlink_peers_unknown_when_the_source_cannot_say():
    gpus, _ = nvml_path(FakeNvml(smi.parse_xml(read(H100))))
    assert all("nvlink_peers" not in e for e in gpus)


def test_real_library_absent_is_an_nvml_error():
    api = N.PynvmlApi()
    try:
        api.init()
    except pynvml.NVMLError as exc:
        assert N.error_text(exc)  # e.g. "NVML Shared Library Not Found"
    else:  # a machine with a driver: reading must work without raising
        try:
            assert isinstance(N.read_cards(api).cards, list)
        finally:
            api.shutdown()


def test_binding_failures_become_function_not_found():
    def broken():
        raise AttributeError("module 'pynvml' has no attribute 'nvmlDeviceGetGpuFabricInfoV'")

    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        N.PynvmlApi()._call(broken)


def test_error_text_does_not_need_the_library():
    assert N.error_text(pynvml.NVMLError(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)) == "Insufficient Resources"
    assert N.error_text(pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)) == "GPU is lost"
