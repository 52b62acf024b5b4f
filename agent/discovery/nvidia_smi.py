"""Parsers for ``nvidia-smi -q -x`` (XML), ``nvidia-smi -q`` (plain text) and ``nvidia-smi -L``.

Each parser is pure: text in, :class:`SmiLog` (or :class:`SmiListing`) out, and
:class:`DiscoveryError` with a sentence for input it cannot read. The XML and
the text parser fill the same structures with the *raw* strings nvidia-smi
printed ("81559 MiB", "N/A", "GPU is lost"): turning them into facts is
:mod:`agent.discovery.gpus`'s job, and keeping the raw text lets the NVML fake
answer exactly as the driver did (``N/A`` becomes NOT_SUPPORTED, ``GPU is
lost`` becomes GPU_IS_LOST).

A field that is ``None`` was not in the capture at all (an older driver, a
``-d`` partial query, a trimmed file): unknown, never zero.
"""

from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field

from agent.discovery.errors import DiscoveryError

# Strings nvidia-smi prints in place of a value. "N/A" means the driver said
# NOT_SUPPORTED; the others are read failures.
NOT_AVAILABLE = "N/A"
GPU_LOST = "GPU is lost"
_ERROR_WORDS = ("gpu is lost", "unknown error", "insufficient permissions", "not supported", "gpu requires reset")


@dataclass
class SmiMigDevice:
    """One MIG device (a compute instance inside a GPU instance) as nvidia-smi lists it."""

    index: int
    gpu_instance_id: str | None = None
    compute_instance_id: str | None = None
    sm_count: str | None = None
    copy_engines: str | None = None
    decoders: str | None = None
    encoders: str | None = None
    jpeg: str | None = None
    ofa: str | None = None
    memory_total: str | None = None
    ecc_uncorrectable: str | None = None  # volatile SRAM uncorrectable, the only ECC counter per instance


@dataclass
class SmiProcess:
    pid: str | None
    type: str | None
    gpu_instance_id: str | None
    compute_instance_id: str | None


@dataclass
class SmiGpu:
    """One card, every value the raw string nvidia-smi printed (``None`` = not in the capture)."""

    pci_bus_id: str | None = None
    name: str | None = None
    uuid: str | None = None
    memory_total: str | None = None
    mig_current: str | None = None
    mig_pending: str | None = None
    # None: the capture has no MIG device list; [] : it says there are none.
    mig_devices: list[SmiMigDevice] | None = None
    # Flattened fabric block: state, status, clique_id, cluster_uuid, summary, bandwidth,
    # route_recovery_in_progress, route_unhealthy, access_timeout_recovery,
    # incorrect_configuration, partition_assigned. None: no fabric block at all.
    fabric: dict[str, str] | None = None
    retired_sbe: str | None = None
    retired_dbe: str | None = None
    retired_pending: str | None = None
    # remapped_rows is a block on cards that have a row remapper and a scalar ("N/A",
    # "GPU is lost") elsewhere; the scalar lands in remap_corr/unc/pending/failure alike.
    remap_pending: str | None = None
    remap_failure: str | None = None
    remap_correctable: str | None = None
    remap_uncorrectable: str | None = None
    # Bank remap availability: max/high/partial/low/none → "192 bank(s)". None: not in the capture.
    remap_histogram: dict[str, str] | None = None
    # Every ECC counter leaf, keyed by XML tag path whichever format it came from:
    # "volatile.sram_correctable", "aggregate.sram_threshold_exceeded",
    # "volatile.double_bit.device_memory" (pre-Turing layout). None: no ECC block.
    ecc_counters: dict[str, str] | None = None
    ecc_mode: str | None = None
    ecc_volatile_uncorrectable: list[str] = field(default_factory=list)
    temperature: str | None = None
    power_draw: str | None = None
    gpu_util: str | None = None
    processes: list[SmiProcess] | None = None

    def values(self) -> list[str]:
        """Every raw string of this card, to spot a card the driver lost."""
        out = [
            v
            for v in (
                self.name,
                self.uuid,
                self.memory_total,
                self.mig_current,
                self.retired_sbe,
                self.retired_dbe,
                self.retired_pending,
                self.remap_pending,
                self.remap_failure,
                self.remap_correctable,
                self.remap_uncorrectable,
                self.temperature,
                self.power_draw,
                self.gpu_util,
            )
            if v is not None
        ]
        out.extend(self.ecc_volatile_uncorrectable)
        if self.fabric:
            out.extend(self.fabric.values())
        return out

    @property
    def lost(self) -> bool:
        return any(is_lost(v) for v in self.values())


@dataclass
class SmiLog:
    """A whole ``nvidia-smi -q`` / ``-q -x`` log."""

    driver_version: str | None = None
    cuda_version: str | None = None
    attached_gpus: int | None = None
    gpus: list[SmiGpu] = field(default_factory=list)


# ---------------------------------------------------------------------------
# raw value helpers


def is_lost(raw: str | None) -> bool:
    return raw is not None and GPU_LOST.lower() in raw.lower()


def is_missing(raw: str | None) -> bool:
    """True when nvidia-smi printed no value: unknown, not supported, or an error."""
    if raw is None:
        return True
    text = raw.strip().strip("[]").strip().lower()
    return text in ("", "n/a", "none") or any(word in text for word in _ERROR_WORDS)


_NUMBER = re.compile(r"^\s*\[?\s*(-?\d+(?:\.\d+)?)")


def number(raw: str | None) -> float | None:
    """The leading number of a raw value ("81559 MiB" -> 81559.0), or None."""
    if is_missing(raw):
        return None
    m = _NUMBER.match(raw or "")
    if not m:
        return None
    value = float(m.group(1))
    return value if math.isfinite(value) else None  # "9999…" past float range is no reading


def integer(raw: str | None) -> int | None:
    value = number(raw)
    return int(value) if value is not None and value == int(value) else None


def yes_no(raw: str | None) -> bool | None:
    """Yes/No/True/False/Enabled/Disabled as a bool; None when unknown."""
    if is_missing(raw):
        return None
    text = (raw or "").strip().lower()
    if text in ("yes", "true", "enabled", "active"):
        return True
    if text in ("no", "false", "disabled", "not active"):
        return False
    return None


_BUS_ID = re.compile(r"^([0-9a-fA-F]{1,8}):([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})\.([0-7])$")


def normalize_bus_id(raw: str | None) -> str | None:
    """PCI address in NVML's form ``00000000:18:00.0``: nvidia-smi, the mock and sysfs disagree on width and case."""
    if raw is None:
        return None
    m = _BUS_ID.match(raw.strip())
    if not m:
        return None
    dom, bus, dev, fn = m.groups()
    return f"{int(dom, 16):08X}:{int(bus, 16):02X}:{int(dev, 16):02X}.{fn}"


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


@dataclass
class _Remap:
    """The remapped-rows block in raw strings; a scalar block ("N/A", "GPU is lost") fills every field."""

    pending: str | None = None
    failure: str | None = None
    correctable: str | None = None
    uncorrectable: str | None = None
    histogram: dict[str, str] | None = None

    @classmethod
    def scalar(cls, raw: str | None) -> _Remap:
        return cls(raw, raw, raw, raw, None)


HISTOGRAM_BUCKETS = ("max", "high", "partial", "low", "none")


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


# ---------------------------------------------------------------------------
# nvidia-smi -q (plain text)
#
# The text is an indented outline: "Key : value" leaves and bare "Section"
# headers, four spaces a level (older drivers) with the key column padded.
# We turn it into a tree of (key, value, children) and then read the same
# facts as from XML.


@dataclass
class _Node:
    key: str
    value: str | None
    indent: int
    children: list[_Node] = field(default_factory=list)

    def child(self, *path: str) -> _Node | None:
        node: _Node | None = self
        for part in path:
            if node is None:
                return None
            node = next((c for c in node.children if c.key.lower() == part.lower()), None)
        return node

    def get(self, *path: str) -> str | None:
        node = self.child(*path)
        return None if node is None else node.value


_GPU_HEADER = re.compile(r"^GPU\s+([0-9A-Fa-f]{1,8}:[0-9A-Fa-f]{1,2}:[0-9A-Fa-f]{1,2}\.[0-7])\s*$")
_KEY_VALUE = re.compile(r"^(\s*)([^:]*?)\s*:\s?(.*)$")


def _outline(lines: list[str]) -> list[_Node]:
    """Lines (already inside one GPU block) as a forest, nesting by indentation."""
    roots: list[_Node] = []
    stack: list[_Node] = []
    for line in lines:
        if not line.strip():
            continue
        expanded = line.expandtabs(4).rstrip()
        indent = len(expanded) - len(expanded.lstrip(" "))
        m = _KEY_VALUE.match(expanded)
        # A colon inside a key ("Bus Id : 00000000:03:00.0") is fine: the key part is lazy and
        # stops at the first " : "-style separator; a bare header has no colon at all.
        if m and m.group(2).strip():
            key, value = m.group(2).strip(), m.group(3).strip()
        else:
            key, value = expanded.strip(), None
        node = _Node(key=key, value=value, indent=indent)
        while stack and stack[-1].indent >= indent:
            stack.pop()
        (stack[-1].children if stack else roots).append(node)
        stack.append(node)
    return roots


def _fabric_text(root: _Node) -> dict[str, str] | None:
    fab = root.child("Fabric")
    if fab is None:
        return None
    out: dict[str, str] = {}
    for key, name in _FABRIC_TEXT:
        value = fab.get(key)
        if value is not None:
            out[name] = value
    health = fab.child("Health")
    if health is not None:
        for c in health.children:
            if c.value is not None:
                out[c.key.lower().replace(" ", "_")] = c.value
    return out


def _retired_text(root: _Node) -> tuple[str | None, str | None, str | None]:
    node = root.child("Retired Pages")
    if node is None:
        return None, None, None
    if node.value is not None and not node.children:  # "Retired Pages : N/A"
        return node.value, node.value, node.value
    sbe = node.get("Single Bit ECC")
    dbe = node.get("Double Bit ECC")
    # Older drivers nest the count: "Single Bit ECC" / "Retired Pages Count"? Newer: a leaf.
    pending = node.get("Pending Page Blacklist")
    if pending is None:
        pending = node.get("Pending Page Retirement")
    return sbe, dbe, pending


def _remapped_text(root: _Node) -> _Remap:
    node = root.child("Remapped Rows")
    if node is None:
        return _Remap()
    if not node.children:
        return _Remap.scalar(node.value)
    histogram = None
    hist = node.child("Bank Remap Availability Histogram")
    if hist is not None and hist.children:
        histogram = {b: v for b in HISTOGRAM_BUCKETS if (v := hist.get(b)) is not None}
    return _Remap(
        pending=node.get("Pending"),
        failure=node.get("Remapping Failure Occurred"),
        correctable=node.get("Correctable Error"),
        uncorrectable=node.get("Uncorrectable Error"),
        histogram=histogram,
    )


# The text's ECC keys in the XML's tag names ("SRAM Uncorrectable SEC-DED" → sram_uncorrectable_secded).
_ECC_TEXT_TAGS = {"texture_shared": "texture_shm"}


def _ecc_tag(key: str) -> str:
    tag = re.sub(r"[\s\-]+", "_", key.strip().lower()).replace("sec_ded", "secded")
    return _ECC_TEXT_TAGS.get(tag, tag)


def _ecc_text(root: _Node) -> dict[str, str] | None:
    node = root.child("ECC Errors")
    if node is None or not node.children:
        return None
    out: dict[str, str] = {}
    for section in ("volatile", "aggregate"):
        block = node.child(section)
        if block is None:
            continue
        for child in block.children:
            if not child.children:
                if child.value is not None:
                    out[f"{section}.{_ecc_tag(child.key)}"] = child.value
                continue
            for leaf in child.children:
                if leaf.value is not None:
                    out[f"{section}.{_ecc_tag(child.key)}.{_ecc_tag(leaf.key)}"] = leaf.value
    return out


def _volatile_text(root: _Node) -> list[str]:
    volatile = root.child("ECC Errors", "Volatile")
    if volatile is None:
        return []
    old = volatile.child("Double Bit", "Total")
    if old is not None and old.value is not None:
        return [old.value]
    return [c.value for c in volatile.children if c.value is not None and "uncorrectable" in c.key.lower()]


def _processes_text(root: _Node) -> list[SmiProcess] | None:
    node = root.child("Processes")
    if node is None:
        return None
    if node.value is not None and not node.children:  # "Processes : None"
        return []
    procs: list[SmiProcess] = []
    gi = ci = None
    for c in node.children:
        key = c.key.lower()
        if key == "gpu instance id":
            gi = c.value
        elif key == "compute instance id":
            ci = c.value
        elif key == "process id":
            procs.append(SmiProcess(pid=c.value, type=c.get("Type"), gpu_instance_id=gi, compute_instance_id=ci))
    return procs


def _mig_devices_text(root: _Node) -> list[SmiMigDevice] | None:
    node = root.child("MIG Devices")
    if node is None:
        return None
    if node.value is not None and not node.children:  # "MIG Devices : None"
        return []
    devices = []
    for position, dev in enumerate(c for c in node.children if c.key.lower() == "mig device"):
        shared = dev.child("Device Attributes", "Shared")
        index = integer(dev.get("Index"))
        devices.append(
            SmiMigDevice(
                index=position if index is None else index,
                gpu_instance_id=dev.get("GPU Instance ID"),
                compute_instance_id=dev.get("Compute Instance ID"),
                sm_count=shared.get("Multiprocessor count") if shared else None,
                copy_engines=shared.get("Copy Engine count") if shared else None,
                decoders=shared.get("Decoder count") if shared else None,
                encoders=shared.get("Encoder count") if shared else None,
                jpeg=shared.get("JPG count") if shared else None,
                ofa=shared.get("OFA count") if shared else None,
                memory_total=dev.get("FB Memory Usage", "Total"),
                ecc_uncorrectable=dev.get("ECC Errors", "Volatile", "SRAM Uncorrectable"),
            )
        )
    return devices


def _gpu_text(bus_id: str, lines: list[str]) -> SmiGpu:
    root = _Node(key="GPU", value=bus_id, indent=-1, children=_outline(lines))
    sbe, dbe, pending = _retired_text(root)
    remap = _remapped_text(root)
    readings = root.child("GPU Power Readings") or root.child("Power Readings")
    power = None
    if readings is not None:
        power = _first_reading([readings.get(k) for k in ("Instant Power Draw", "Power Draw", "Average Power Draw")])
    return SmiGpu(
        pci_bus_id=root.get("PCI", "Bus Id") or bus_id,
        name=root.get("Product Name"),
        uuid=root.get("GPU UUID"),
        memory_total=root.get("FB Memory Usage", "Total"),
        mig_current=root.get("MIG Mode", "Current"),
        mig_pending=root.get("MIG Mode", "Pending"),
        mig_devices=_mig_devices_text(root),
        fabric=_fabric_text(root),
        retired_sbe=sbe,
        retired_dbe=dbe,
        retired_pending=pending,
        remap_pending=remap.pending,
        remap_failure=remap.failure,
        remap_correctable=remap.correctable,
        remap_uncorrectable=remap.uncorrectable,
        remap_histogram=remap.histogram,
        ecc_counters=_ecc_text(root),
        ecc_mode=root.get("ECC Mode", "Current"),
        ecc_volatile_uncorrectable=_volatile_text(root),
        temperature=root.get("Temperature", "GPU Current Temp"),
        power_draw=power,
        gpu_util=root.get("Utilization", "Gpu"),
        processes=_processes_text(root),
    )


def parse_text(text: str) -> SmiLog:
    """Parse plain ``nvidia-smi -q`` (also ``-q -d SECTION``). DiscoveryError for a truncated or foreign log."""
    if not text or not text.strip():
        raise DiscoveryError("nvidia-smi -q output is empty")
    if "\x00" in text:
        raise DiscoveryError("nvidia-smi -q output contains NUL bytes: not a text log")
    lines = text.splitlines()
    log = SmiLog()
    blocks: list[tuple[str, list[str]]] = []
    seen_header = False
    for line in lines:
        stripped = line.strip()
        if stripped.startswith("=") and "NVSMI LOG" in stripped:
            seen_header = True
            continue
        m = _GPU_HEADER.match(line.rstrip())
        if m:
            blocks.append((m.group(1), []))
            continue
        if blocks:
            blocks[-1][1].append(line)
            continue
        kv = _KEY_VALUE.match(line)
        if kv and kv.group(2).strip():
            key, value = kv.group(2).strip().lower(), kv.group(3).strip()
            if key == "driver version":
                log.driver_version = value
            elif key == "cuda version":
                log.cuda_version = value
            elif key == "attached gpus":
                log.attached_gpus = integer(value)
    if not seen_header and log.attached_gpus is None and not blocks:
        raise DiscoveryError("nvidia-smi -q output has neither the NVSMI LOG header nor any GPU block")
    log.gpus = [_gpu_text(bus, body) for bus, body in blocks]
    # The only sign of a text log cut short is a GPU count that does not add up
    # (the last block simply stops); a log with fewer blocks than attached GPUs
    # cannot be trusted for the ones it does hold either.
    if log.attached_gpus is not None and len(log.gpus) != log.attached_gpus:
        raise DiscoveryError(
            f"nvidia-smi -q output is truncated or damaged: it says {log.attached_gpus} GPUs are attached "
            f"but holds {len(log.gpus)} GPU block(s)"
        )
    if log.attached_gpus is None and log.driver_version is None and not seen_header:
        raise DiscoveryError("nvidia-smi -q output lacks its header (driver version, attached GPUs)")
    return log


# ---------------------------------------------------------------------------
# nvidia-smi -L


@dataclass
class ListedMig:
    """``MIG 1g.12gb Device 0: (UUID: MIG-…)`` under a GPU line."""

    device: int
    profile: str
    uuid: str


@dataclass
class ListedGpu:
    index: int
    name: str
    uuid: str | None
    migs: list[ListedMig] = field(default_factory=list)


@dataclass
class SmiListing:
    gpus: list[ListedGpu] = field(default_factory=list)


_L_GPU = re.compile(r"^GPU\s+(\d+):\s*(.*?)\s*(?:\(UUID:\s*([^)\s]+)\s*\))?\s*$")
_L_MIG = re.compile(r"^MIG\s+(\S+)\s+Device\s+(\d+):\s*\(UUID:\s*([^)\s]+)\s*\)\s*$")


def parse_list(text: str) -> SmiListing:
    """Parse ``nvidia-smi -L``.

    Lines may carry a leading ``#`` and indentation (a listing pasted into a
    YAML comment) and unrelated lines are skipped; a MIG line before any GPU
    line, or a text with no GPU line at all, is an error.
    """
    if text is None or not text.strip():
        raise DiscoveryError("nvidia-smi -L output is empty")
    listing = SmiListing()
    for number_, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip().lstrip("#").strip()
        if not line:
            continue
        m = _L_GPU.match(line)
        if m:
            listing.gpus.append(ListedGpu(index=int(m.group(1)), name=m.group(2), uuid=m.group(3)))
            continue
        m = _L_MIG.match(line)
        if m:
            if not listing.gpus:
                raise DiscoveryError(f"nvidia-smi -L output lists a MIG device before any GPU, line {number_}")
            listing.gpus[-1].migs.append(ListedMig(device=int(m.group(2)), profile=m.group(1), uuid=m.group(3)))
    if not listing.gpus:
        raise DiscoveryError("nvidia-smi -L output has no 'GPU N: name (UUID: …)' line")
    indices = [g.index for g in listing.gpus]
    if len(set(indices)) != len(indices):
        raise DiscoveryError("nvidia-smi -L output lists the same GPU index twice")
    return listing


def parse_fabric_block(text: str) -> dict[str, str]:
    """The ``Fabric`` section of ``nvidia-smi -q`` on its own (a grep, a pasted fragment), flattened as in SmiGpu.

    Lines outside the section are ignored (grep's ``--`` separators, the command line).
    """
    lines = [raw for raw in (text or "").splitlines() if raw.strip() and not raw.lstrip().startswith(("#", "--"))]
    roots = _outline(lines)
    holder = _Node(key="GPU", value=None, indent=-1, children=roots)
    fabric = _fabric_text(holder)
    if fabric is None:
        raise DiscoveryError("text has no 'Fabric' section")
    return fabric
