"""``nvidia-smi -q``: the plain-text report, an indented outline, read into the same :class:`SmiLog` as the XML."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from agent.discovery.errors import DiscoveryError
from agent.discovery.nvidia_smi.records import (
    HISTOGRAM_BUCKETS,
    SmiGpu,
    SmiLog,
    SmiMigDevice,
    SmiProcess,
    _Remap,
    integer,
)
from agent.discovery.nvidia_smi.xml import _FABRIC_TEXT, _first_reading

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
