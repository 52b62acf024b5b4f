"""``nvidia-smi -q -x``: the XML report, read into :class:`SmiLog`."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from agent.discovery.errors import DiscoveryError
from agent.discovery.nvidia_smi.records import (
    HISTOGRAM_BUCKETS,
    SmiGpu,
    SmiLog,
    SmiMigDevice,
    SmiProcess,
    _Remap,
    integer,
    number,
)

# ---------------------------------------------------------------------------
# nvidia-smi -q -x


def _text(el: ET.Element | None, path: str) -> str | None:
    if el is None:
        return None
    found = el.find(path)
    if found is None:
        return None
    return (found.text or "").strip()


_FABRIC_XML = (("state", "state"), ("status", "status"), ("cliqueId", "clique_id"), ("clusterUuid", "cluster_uuid"))
_FABRIC_TEXT = (("State", "state"), ("Status", "status"), ("CliqueId", "clique_id"), ("ClusterUUID", "cluster_uuid"))


def _fabric_xml(gpu: ET.Element) -> dict[str, str] | None:
    el = gpu.find("fabric")
    if el is None:
        return None
    out: dict[str, str] = {}
    for tag, key in _FABRIC_XML:
        value = _text(el, tag)
        if value is not None:
            out[key] = value
    health = el.find("health")
    if health is not None:
        for child in health:
            if len(child) == 0:
                out[child.tag] = (child.text or "").strip()
    return out


def _mig_devices_xml(gpu: ET.Element) -> list[SmiMigDevice] | None:
    el = gpu.find("mig_devices")
    if el is None:
        return None
    devices = []
    for position, dev in enumerate(el.findall("mig_device")):
        shared = dev.find("device_attributes/shared")
        index = integer(_text(dev, "index"))
        devices.append(
            SmiMigDevice(
                index=position if index is None else index,
                gpu_instance_id=_text(dev, "gpu_instance_id"),
                compute_instance_id=_text(dev, "compute_instance_id"),
                sm_count=_text(shared, "multiprocessor_count"),
                copy_engines=_text(shared, "copy_engine_count"),
                decoders=_text(shared, "decoder_count"),
                encoders=_text(shared, "encoder_count"),
                jpeg=_text(shared, "jpg_count"),
                ofa=_text(shared, "ofa_count"),
                memory_total=_text(dev, "fb_memory_usage/total"),
                ecc_uncorrectable=_text(dev, "ecc_error_count/volatile_count/sram_uncorrectable"),
            )
        )
    return devices


def _volatile_uncorrectable_xml(gpu: ET.Element) -> list[str]:
    volatile = gpu.find("ecc_errors/volatile")
    if volatile is None:
        return []
    # Older schemas: volatile/double_bit/total; newer: sram_uncorrectable[_parity|_secded], dram_uncorrectable.
    old = _text(volatile, "double_bit/total")
    if old is not None:
        return [old]
    return [(c.text or "").strip() for c in volatile if len(c) == 0 and "uncorrectable" in c.tag]


def _power_xml(gpu: ET.Element) -> str | None:
    readings = gpu.find("gpu_power_readings")
    if readings is None:
        readings = gpu.find("power_readings")  # drivers before 525
    return _first_reading([_text(readings, tag) for tag in _POWER_TAGS])


# Newer drivers split "power_draw" into an instant and a 1-second average reading;
# the instant one is what older drivers called power_draw.
_POWER_TAGS = ("instant_power_draw", "power_draw", "average_power_draw")


def _first_reading(candidates: list[str | None]) -> str | None:
    """The first candidate holding a number; failing that the first present (so N/A stays N/A)."""
    present = [c for c in candidates if c is not None]
    return next((c for c in present if number(c) is not None), present[0] if present else None)


def _processes_xml(gpu: ET.Element) -> list[SmiProcess] | None:
    el = gpu.find("processes")
    if el is None:
        return None
    return [
        SmiProcess(
            pid=_text(p, "pid"),
            type=_text(p, "type"),
            gpu_instance_id=_text(p, "gpu_instance_id"),
            compute_instance_id=_text(p, "compute_instance_id"),
        )
        for p in el.findall("process_info")
    ]


def _remapped_xml(gpu: ET.Element) -> _Remap:
    el = gpu.find("remapped_rows")
    if el is None:
        return _Remap()
    if len(el) == 0:  # a scalar: N/A or GPU is lost
        return _Remap.scalar((el.text or "").strip())
    histogram = None
    hist = el.find("row_remapper_histogram")
    if hist is not None and len(hist):
        histogram = {b: v for b in HISTOGRAM_BUCKETS if (v := _text(hist, f"row_remapper_histogram_{b}")) is not None}
    return _Remap(
        pending=_text(el, "remapped_row_pending"),
        failure=_text(el, "remapped_row_failure"),
        correctable=_text(el, "remapped_row_corr"),
        uncorrectable=_text(el, "remapped_row_unc"),
        histogram=histogram,
    )


def _ecc_xml(gpu: ET.Element) -> dict[str, str] | None:
    el = gpu.find("ecc_errors")
    if el is None or len(el) == 0:
        return None
    out: dict[str, str] = {}
    for section in ("volatile", "aggregate"):
        block = el.find(section)
        if block is None:
            continue
        for child in block:
            if len(child) == 0:
                out[f"{section}.{child.tag}"] = (child.text or "").strip()
            else:  # pre-Turing: single_bit / double_bit, each per location
                for leaf in child:
                    out[f"{section}.{child.tag}.{leaf.tag}"] = (leaf.text or "").strip()
    return out


def _gpu_xml(gpu: ET.Element) -> SmiGpu:
    remap = _remapped_xml(gpu)
    return SmiGpu(
        pci_bus_id=_text(gpu, "pci/pci_bus_id") or gpu.get("id"),
        name=_text(gpu, "product_name"),
        uuid=_text(gpu, "uuid"),
        memory_total=_text(gpu, "fb_memory_usage/total"),
        mig_current=_text(gpu, "mig_mode/current_mig"),
        mig_pending=_text(gpu, "mig_mode/pending_mig"),
        mig_devices=_mig_devices_xml(gpu),
        fabric=_fabric_xml(gpu),
        retired_sbe=_text(gpu, "retired_pages/multiple_single_bit_retirement/retired_count"),
        retired_dbe=_text(gpu, "retired_pages/double_bit_retirement/retired_count"),
        retired_pending=_text(gpu, "retired_pages/pending_retirement"),
        remap_pending=remap.pending,
        remap_failure=remap.failure,
        remap_correctable=remap.correctable,
        remap_uncorrectable=remap.uncorrectable,
        remap_histogram=remap.histogram,
        ecc_counters=_ecc_xml(gpu),
        ecc_mode=_text(gpu, "ecc_mode/current_ecc"),
        ecc_volatile_uncorrectable=_volatile_uncorrectable_xml(gpu),
        temperature=_text(gpu, "temperature/gpu_temp"),
        power_draw=_power_xml(gpu),
        gpu_util=_text(gpu, "utilization/gpu_util"),
        processes=_processes_xml(gpu),
    )


def parse_xml(text: str) -> SmiLog:
    """Parse ``nvidia-smi -q -x``. Raises DiscoveryError for anything that is not such a log."""
    if not text or not text.strip():
        raise DiscoveryError("nvidia-smi -q -x output is empty")
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise DiscoveryError(f"nvidia-smi -q -x output is not valid XML: {exc}") from None
    except (ValueError, RecursionError) as exc:  # e.g. NUL bytes, absurd nesting
        raise DiscoveryError(f"nvidia-smi -q -x output is not valid XML: {exc}") from None
    if root.tag != "nvidia_smi_log":
        raise DiscoveryError(f"nvidia-smi -q -x output has root element <{root.tag}>, expected <nvidia_smi_log>")
    return SmiLog(
        driver_version=_text(root, "driver_version"),
        cuda_version=_text(root, "cuda_version"),
        attached_gpus=integer(_text(root, "attached_gpus")),
        gpus=[_gpu_xml(g) for g in root.findall("gpu")],
    )
