"""A fake NVML fed from an ``nvidia-smi -q -x`` capture, for the tests and benchmarks: it answers each call as
the driver did on the machine the capture came from (raising what the driver raises for a value it lacks).

Nothing on a node uses it: the agent reads the real NVML through :class:`agent.discovery.nvml.PynvmlApi`.
"""

from __future__ import annotations

import time
import uuid as uuidlib
from dataclasses import dataclass
from typing import Any

import pynvml

from agent.discovery import gpus as G
from agent.discovery import nvidia_smi as smi
from agent.discovery.nvml import (
    _INCORRECT_CODE,
    _LEGACY_LOCATION,
    _MASK,
    _RETURN_CODE,
    _STATE_CODE,
    _SUMMARY_CODE,
    FabricInfo,
    MigAttributes,
    nvml_error,
)


def _raise_for(raw: str | None) -> None:
    """Raise what NVML would have for a raw nvidia-smi value that is not a value."""
    if raw is None:
        raise nvml_error(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
    if smi.is_lost(raw):
        raise nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST)
    if smi.is_missing(raw):
        text = raw.strip().strip("[]").strip().lower()
        if text in ("n/a", "", "none", "not supported"):
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        raise nvml_error(_RETURN_CODE.get(text, pynvml.NVML_ERROR_UNKNOWN))


def _int(raw: str | None) -> int:
    _raise_for(raw)
    value = smi.integer(raw)
    if value is None:
        raise nvml_error(pynvml.NVML_ERROR_UNKNOWN)
    return value


def _bool(raw: str | None) -> bool:
    _raise_for(raw)
    value = smi.yes_no(raw)
    if value is None:
        raise nvml_error(pynvml.NVML_ERROR_UNKNOWN)
    return value


def _lower(raw: str | None) -> str:
    return (raw or "").strip().lower()


def _tristate(raw: str | None) -> int:
    """A health-mask field: 1 true, 2 false, 0 not supported."""
    value = smi.yes_no(raw)
    return 0 if value is None else (1 if value else 2)


def _uuid_bytes(raw: str | None) -> bytes:
    """A UUID string as NVML's 16 bytes; zeros when absent or unreadable (as NVML leaves them)."""
    if raw is None or smi.is_missing(raw):
        return bytes(16)
    try:
        return uuidlib.UUID(raw.strip()).bytes
    except ValueError:
        return bytes(16)


# NVML memory locations of pre-Turing per-location ECC counters → nvidia-smi's tag for them.


@dataclass(frozen=True)
class _Card:
    index: int


@dataclass(frozen=True)
class _Mig:
    card: int
    device: int


class FakeNvml:
    """NvmlApi answering from a parsed ``nvidia-smi -q -x`` (and optionally ``-L``) capture."""

    def __init__(self, log: smi.SmiLog, listing: smi.SmiListing | None = None) -> None:
        self.log = log
        self.listing = listing
        self.initialised = False
        # Xid events: (card index, code) the fake driver will report, and whether it allows events at all.
        self.xid_queue: list[tuple[int, int]] = []
        self.events_supported = True
        self.event_sets_open = 0

    # -- system
    def init(self) -> None:
        self.initialised = True

    def shutdown(self) -> None:
        self.initialised = False

    def driver_version(self) -> str:
        _raise_for(self.log.driver_version)
        return str(self.log.driver_version)

    def cuda_version(self) -> str:
        _raise_for(self.log.cuda_version)
        return str(self.log.cuda_version)

    def device_count(self) -> int:
        return len(self.log.gpus)

    def handle(self, index: int) -> Any:
        if not 0 <= index < len(self.log.gpus):
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return _Card(index)

    # -- helpers
    def _gpu(self, handle: Any) -> smi.SmiGpu:
        if isinstance(handle, _Mig):
            return self.log.gpus[handle.card]
        return self.log.gpus[handle.index]

    def _mig(self, mig: _Mig) -> smi.SmiMigDevice:
        devices = self.log.gpus[mig.card].mig_devices or []
        found = next((d for d in devices if d.index == mig.device), None)
        if found is None:
            raise nvml_error(pynvml.NVML_ERROR_NOT_FOUND)
        return found

    def _listed_mig(self, mig: _Mig) -> smi.ListedMig:
        gpu = self.log.gpus[mig.card]
        for listed in self.listing.gpus if self.listing else []:
            if listed.uuid == gpu.uuid or (listed.uuid is None and listed.index == mig.card):
                found = next((m for m in listed.migs if m.device == mig.device), None)
                if found is not None:
                    return found
        raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)

    # -- identity
    def name(self, handle: Any) -> str:
        raw = self._gpu(handle).name
        _raise_for(raw)
        return str(raw)

    def uuid(self, handle: Any) -> str:
        if isinstance(handle, _Mig):
            return self._listed_mig(handle).uuid
        raw = self._gpu(handle).uuid
        _raise_for(raw)
        return str(raw)

    def memory_total_mib(self, handle: Any) -> int:
        if isinstance(handle, _Mig):
            return _int(self._mig(handle).memory_total)
        return _int(self._gpu(handle).memory_total)

    def pci_bus_id(self, handle: Any) -> str:
        raw = self._gpu(handle).pci_bus_id
        _raise_for(raw)
        return str(raw)

    def numa_node(self, handle: Any) -> int:
        raise nvml_error(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)  # -q -x does not carry it

    # -- fabric
    def fabric_info(self, handle: Any) -> FabricInfo:
        raw = self._gpu(handle).fabric
        if raw is None:
            raise nvml_error(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        state_raw = raw.get("state")
        _raise_for(state_raw)
        state = _STATE_CODE.get(str(state_raw).strip().lower())
        if state is None:
            raise nvml_error(pynvml.NVML_ERROR_UNKNOWN)
        if state == 0:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        status_raw = (raw.get("status") or "").strip()
        status = _RETURN_CODE.get(status_raw.lower(), pynvml.NVML_ERROR_UNKNOWN)
        cluster_bytes = _uuid_bytes(raw.get("cluster_uuid"))
        clique = smi.integer(raw.get("clique_id")) or 0
        has_health = any(k in raw for k in ("bandwidth", "route_unhealthy", "summary"))
        mask = None
        if has_health:
            bandwidth = (raw.get("bandwidth") or "").strip().lower()
            fields = {
                "degraded_bw": {"degraded": 1, "full": 2}.get(bandwidth, 0),
                "route_recovery": _tristate(raw.get("route_recovery_in_progress")),
                "route_unhealthy": _tristate(raw.get("route_unhealthy")),
                "access_timeout_recovery": _tristate(raw.get("access_timeout_recovery")),
                "incorrect_configuration": _INCORRECT_CODE.get(_lower(raw.get("incorrect_configuration")), 0),
                "partition_assigned": _tristate(raw.get("partition_assigned")),
            }
            mask = sum(value << _MASK[key][0] for key, value in fields.items())
        summary = None
        if "summary" in raw:
            summary = _SUMMARY_CODE.get(raw["summary"].strip().lower(), 0)
        return FabricInfo(state, status, cluster_bytes, clique, mask, summary)

    # -- MIG
    def mig_mode(self, handle: Any) -> tuple[int, int]:
        gpu = self._gpu(handle)
        current = _bool(gpu.mig_current)
        pending = _bool(gpu.mig_pending) if gpu.mig_pending is not None else current
        return int(current), int(pending)

    def max_mig_devices(self, handle: Any) -> int:
        devices = self._gpu(handle).mig_devices
        if devices is None:
            raise nvml_error(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        return max((d.index + 1 for d in devices), default=7)

    def mig_handle(self, handle: Any, index: int) -> Any:
        mig = _Mig(handle.index, index)
        self._mig(mig)
        return mig

    def mig_instance_ids(self, mig: Any) -> tuple[int, int]:
        dev = self._mig(mig)
        return _int(dev.gpu_instance_id), _int(dev.compute_instance_id)

    def mig_attributes(self, mig: Any) -> MigAttributes:
        dev = self._mig(mig)
        return MigAttributes(
            sm_count=smi.integer(dev.sm_count),
            copy_engines=smi.integer(dev.copy_engines),
            ofa=smi.integer(dev.ofa),
            jpeg=smi.integer(dev.jpeg),
        )

    def mig_profile_name(self, mig: Any) -> str:
        return self._listed_mig(mig).profile

    # -- health
    def retired_pages(self, handle: Any) -> tuple[int, int]:
        gpu = self._gpu(handle)
        return _int(gpu.retired_sbe), _int(gpu.retired_dbe)

    def retired_pages_pending(self, handle: Any) -> bool:
        return _bool(self._gpu(handle).retired_pending)

    def remapped_rows(self, handle: Any) -> tuple[int, int, bool, bool]:
        gpu = self._gpu(handle)
        return (
            _int(gpu.remap_correctable),
            _int(gpu.remap_uncorrectable),
            _bool(gpu.remap_pending),
            _bool(gpu.remap_failure),
        )

    def row_remapper_histogram(self, handle: Any) -> dict[str, int]:
        gpu = self._gpu(handle)
        if gpu.remap_histogram is None:
            _raise_for(gpu.remap_pending)  # a scalar block says why (N/A, GPU is lost)
            raise nvml_error(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        return {bucket: _int(gpu.remap_histogram.get(bucket)) for bucket in smi.HISTOGRAM_BUCKETS}

    def memory_error_counter(self, handle: Any, error_type: int, counter_type: int, location: int) -> int:
        raw = self._gpu(handle).ecc_counters
        if raw is None:
            raise nvml_error(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        section = "volatile" if counter_type == pynvml.NVML_VOLATILE_ECC else "aggregate"
        kind = "correctable" if error_type == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED else "uncorrectable"
        bit = "single_bit" if kind == "correctable" else "double_bit"
        if location == pynvml.NVML_MEMORY_LOCATION_DRAM:
            key = f"{section}.dram_{kind}"
            return _int(raw[key] if key in raw else raw.get(f"{section}.{bit}.device_memory"))
        if location == pynvml.NVML_MEMORY_LOCATION_SRAM:
            if f"{section}.sram_{kind}" in raw:
                return _int(raw[f"{section}.sram_{kind}"])
            split = [raw[k] for k in (f"{section}.sram_{kind}_parity", f"{section}.sram_{kind}_secded") if k in raw]
            if not split:  # a pre-Turing card counts per location, not SRAM as a whole
                raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
            values = [smi.integer(r) for r in split]
            if all(v is None for v in values):
                _raise_for(split[0])
            return sum(v for v in values if v is not None)
        name = _LEGACY_LOCATION.get(location)
        return _int(raw.get(f"{section}.{bit}.{name}") if name else None)

    def sram_threshold_exceeded(self, handle: Any) -> bool:
        raw = self._gpu(handle).ecc_counters
        return _bool(None if raw is None else raw.get("aggregate.sram_threshold_exceeded"))

    def ecc_volatile_uncorrected(self, handle: Any) -> int:
        if isinstance(handle, _Mig):
            return _int(self._mig(handle).ecc_uncorrectable)
        raws = self._gpu(handle).ecc_volatile_uncorrectable
        if not raws:
            raise nvml_error(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        values = [smi.integer(r) for r in raws]
        if all(v is None for v in values):
            _raise_for(next((r for r in raws if smi.is_lost(r)), raws[0]))
            raise nvml_error(pynvml.NVML_ERROR_UNKNOWN)
        return sum(v for v in values if v is not None)

    # -- live readings
    def temperature_c(self, handle: Any) -> int:
        return _int(self._gpu(handle).temperature)

    def power_mw(self, handle: Any) -> int:
        raw = self._gpu(handle).power_draw
        _raise_for(raw)
        watts = smi.number(raw)
        if watts is None:
            raise nvml_error(pynvml.NVML_ERROR_UNKNOWN)
        return round(watts * 1000)

    def utilization_pct(self, handle: Any) -> int:
        return _int(self._gpu(handle).gpu_util)

    def process_pids(self, handle: Any) -> list[int]:
        processes = self._gpu(handle).processes
        if processes is None:
            raise nvml_error(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        if isinstance(handle, _Mig):
            dev = self._mig(handle)
            mine = (smi.integer(dev.gpu_instance_id), smi.integer(dev.compute_instance_id))
            processes = [p for p in processes if G.instance_of(p) == mine]
        return sorted({pid for p in processes if (pid := smi.integer(p.pid)) is not None})

    def nvlink_p2p(self, handle: Any, other: Any) -> bool:
        raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)  # -q -x says nothing about NVLink peers

    def xid_event_set(self, handles: list[Any]) -> Any:
        if not self.events_supported:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        self.event_sets_open += 1
        return object()

    def wait_xid(self, event_set: Any, timeout_ms: int) -> tuple[str, int] | None:
        if not self.xid_queue:
            time.sleep(min(timeout_ms, 10) / 1000)  # a short wait, as NVML's would be, then nothing
            return None
        index, code = self.xid_queue.pop(0)
        return self.pci_bus_id(_Card(index)), code

    def free_event_set(self, event_set: Any) -> None:
        self.event_sets_open -= 1
