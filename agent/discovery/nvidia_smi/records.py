"""What the nvidia-smi parsers fill, in the raw strings nvidia-smi printed, and the helpers that read those strings."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

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
