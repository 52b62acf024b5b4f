"""Reading GPUs through NVML, behind a small interface that a capture can stand in for.

:class:`NvmlApi` is the handful of NVML questions discovery asks, in plain
Python types. Every method may raise ``pynvml.NVMLError`` (a subclass per
NVML return code); :func:`read_cards` catches that per call, so one card the
driver lost, or one query an old driver lacks, costs only that fact.

* :class:`PynvmlApi` answers from the real library (nvidia-ml-py).
* ``agent.discovery.nvml_fake.FakeNvml`` answers from a parsed ``nvidia-smi -q -x`` capture, raising
  what NVML would have: ``N/A`` -> NOT_SUPPORTED, ``GPU is lost`` ->
  GPU_IS_LOST, a field the capture lacks -> FUNCTION_NOT_FOUND. The NVML path
  over a FakeNvml must give the same GPU entries as the nvidia-smi path over
  the same capture; the tests hold it to that.
"""

from __future__ import annotations

import contextlib
import ctypes
import uuid as uuidlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import pynvml

from agent.discovery import fabric_facts
from agent.discovery import gpus as G
from agent.discovery import nvidia_smi as smi

T = TypeVar("T")

# nvidia-smi's words for NVML return codes, as it prints them in the fabric "Status" line.
_RETURN_TEXT = {
    pynvml.NVML_SUCCESS: "Success",
    pynvml.NVML_ERROR_UNINITIALIZED: "Uninitialized",
    pynvml.NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    pynvml.NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    pynvml.NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
    pynvml.NVML_ERROR_NOT_FOUND: "Not Found",
    pynvml.NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    pynvml.NVML_ERROR_TIMEOUT: "Timeout",
    pynvml.NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    pynvml.NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
    pynvml.NVML_ERROR_GPU_IS_LOST: "GPU is lost",
    pynvml.NVML_ERROR_RESET_REQUIRED: "GPU requires restart",
    pynvml.NVML_ERROR_IN_USE: "In Use",
    pynvml.NVML_ERROR_MEMORY: "Insufficient Memory",
    pynvml.NVML_ERROR_NO_DATA: "No Data",
    pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES: "Insufficient Resources",
    pynvml.NVML_ERROR_NOT_READY: "Not Ready",
    pynvml.NVML_ERROR_UNKNOWN: "Unknown Error",
}
_RETURN_CODE = {text.lower(): code for code, text in _RETURN_TEXT.items()}

_STATE_TEXT = {0: "Not Supported", 1: "Not Started", 2: "In Progress", 3: "Completed"}
_STATE_CODE = {text.lower(): code for code, text in _STATE_TEXT.items()}
_SUMMARY_TEXT = {1: "Healthy", 2: "Unhealthy", 3: "Limited Capacity"}
_SUMMARY_CODE = {text.lower(): code for code, text in _SUMMARY_TEXT.items()}
_INCORRECT_TEXT = {
    1: "None",
    2: "Incorrect SysGUID",
    3: "Incorrect Chassis Serial Number",
    4: "No Partition",
    5: "Insufficient NVLinks",
    6: "Incompatible GPU Firmware",
    7: "Invalid Location",
    8: "GPU State Invalid",
}
_INCORRECT_CODE = {text.lower(): code for code, text in _INCORRECT_TEXT.items()}

# healthMask fields: (shift, width) from nvml.h; each 2-bit field reads 0 = not supported, 1 = true, 2 = false.
_MASK = {
    "degraded_bw": (0, 0x3),
    "route_recovery": (2, 0x3),
    "route_unhealthy": (4, 0x3),
    "access_timeout_recovery": (6, 0x3),
    "incorrect_configuration": (8, 0xF),
    "partition_assigned": (12, 0x3),
    "gfm_state": (14, 0x3),
}


def error_text(exc: BaseException) -> str:
    """An NVMLError in words, without asking the (possibly absent) library to translate the code."""
    value = getattr(exc, "value", None)
    if isinstance(value, int) and value in _RETURN_TEXT:
        return _RETURN_TEXT[value]
    return str(exc) or type(exc).__name__


def nvml_error(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


@dataclass(frozen=True)
class FabricInfo:
    """nvmlGpuFabricInfo(V): None in health_mask/health_summary when the struct version lacks the field."""

    state: int
    status: int
    cluster_uuid: bytes
    clique_id: int
    health_mask: int | None = None
    health_summary: int | None = None


@dataclass(frozen=True)
class MigAttributes:
    """nvmlDeviceGetAttributes of a MIG device; slice counts are None when the source cannot say."""

    sm_count: int | None
    copy_engines: int | None
    ofa: int | None
    jpeg: int | None
    gi_slices: int | None = None
    ci_slices: int | None = None


class NvmlApi(Protocol):
    """The NVML questions discovery asks. Every method may raise pynvml.NVMLError."""

    def init(self) -> None: ...
    def shutdown(self) -> None: ...
    def driver_version(self) -> str: ...
    def cuda_version(self) -> str: ...
    def device_count(self) -> int: ...
    def handle(self, index: int) -> Any: ...
    def name(self, handle: Any) -> str: ...
    def uuid(self, handle: Any) -> str: ...
    def memory_total_mib(self, handle: Any) -> int: ...
    def pci_bus_id(self, handle: Any) -> str: ...
    def numa_node(self, handle: Any) -> int: ...
    def fabric_info(self, handle: Any) -> FabricInfo: ...
    def mig_mode(self, handle: Any) -> tuple[int, int]: ...
    def max_mig_devices(self, handle: Any) -> int: ...
    def mig_handle(self, handle: Any, index: int) -> Any: ...
    def mig_instance_ids(self, mig: Any) -> tuple[int, int]: ...
    def mig_attributes(self, mig: Any) -> MigAttributes: ...
    def mig_profile_name(self, mig: Any) -> str: ...
    def retired_pages(self, handle: Any) -> tuple[int, int]: ...
    def retired_pages_pending(self, handle: Any) -> bool: ...
    def remapped_rows(self, handle: Any) -> tuple[int, int, bool, bool]: ...
    def row_remapper_histogram(self, handle: Any) -> dict[str, int]: ...
    def memory_error_counter(self, handle: Any, error_type: int, counter_type: int, location: int) -> int: ...
    def sram_threshold_exceeded(self, handle: Any) -> bool: ...
    def ecc_volatile_uncorrected(self, handle: Any) -> int: ...
    def temperature_c(self, handle: Any) -> int: ...
    def power_mw(self, handle: Any) -> int: ...
    def utilization_pct(self, handle: Any) -> int: ...
    def process_pids(self, handle: Any) -> list[int]: ...
    def nvlink_p2p(self, handle: Any, other: Any) -> bool: ...
    # Xid events (agent.discovery.xids.watch_nvml): a set registered on every card, waited on.
    def xid_event_set(self, handles: list[Any]) -> Any: ...
    def wait_xid(self, event_set: Any, timeout_ms: int) -> tuple[str, int] | None: ...
    def free_event_set(self, event_set: Any) -> None: ...


# ---------------------------------------------------------------------------
# the real library


def _str(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class PynvmlApi:
    """NvmlApi over nvidia-ml-py. Anything but an NVMLError (a binding too old to know a function,
    a ctypes mismatch) is turned into FUNCTION_NOT_FOUND so that callers see one exception type."""

    def _call(self, fn: Callable[..., T], *args: Any) -> T:
        try:
            return fn(*args)
        except pynvml.NVMLError:
            raise
        except Exception:  # noqa: BLE001 - missing binding or function in an old nvidia-ml-py / driver
            raise nvml_error(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND) from None

    def init(self) -> None:
        self._call(pynvml.nvmlInit)

    def shutdown(self) -> None:
        self._call(pynvml.nvmlShutdown)

    def driver_version(self) -> str:
        return _str(self._call(pynvml.nvmlSystemGetDriverVersion))

    def cuda_version(self) -> str:
        v = int(self._call(pynvml.nvmlSystemGetCudaDriverVersion))
        return f"{v // 1000}.{(v % 1000) // 10}"

    def device_count(self) -> int:
        return int(self._call(pynvml.nvmlDeviceGetCount))

    def handle(self, index: int) -> Any:
        return self._call(pynvml.nvmlDeviceGetHandleByIndex, index)

    def name(self, handle: Any) -> str:
        return _str(self._call(pynvml.nvmlDeviceGetName, handle))

    def uuid(self, handle: Any) -> str:
        return _str(self._call(pynvml.nvmlDeviceGetUUID, handle))

    def memory_total_mib(self, handle: Any) -> int:
        return int(self._call(pynvml.nvmlDeviceGetMemoryInfo, handle).total) // (1024 * 1024)

    def pci_bus_id(self, handle: Any) -> str:
        return _str(self._call(pynvml.nvmlDeviceGetPciInfo, handle).busId)

    def numa_node(self, handle: Any) -> int:
        return int(self._call(pynvml.nvmlDeviceGetNumaNodeId, handle))

    def fabric_info(self, handle: Any) -> FabricInfo:
        # Newest struct first; a driver that knows an older version only answers ARGUMENT_VERSION_MISMATCH,
        # and one from before the V call has only nvmlDeviceGetGpuFabricInfo (no health at all).
        versions = (("c_nvmlGpuFabricInfo_v3_t", True), ("c_nvmlGpuFabricInfo_v2_t", False))
        for struct_name, has_summary in versions:
            struct = getattr(pynvml, struct_name, None)
            if struct is None:
                continue
            info = struct()
            try:
                self._call(pynvml.nvmlDeviceGetGpuFabricInfoV, handle, ctypes.byref(info))
            except pynvml.NVMLError as exc:
                if getattr(exc, "value", None) in (
                    pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
                    pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
                ):
                    continue
                raise
            return FabricInfo(
                state=int(info.state),
                status=int(info.status),
                cluster_uuid=bytes(info.clusterUuid),
                clique_id=int(info.cliqueId),
                health_mask=int(info.healthMask),
                health_summary=int(info.healthSummary) if has_summary else None,
            )
        info = pynvml.c_nvmlGpuFabricInfo_t()
        self._call(pynvml.nvmlDeviceGetGpuFabricInfo, handle, ctypes.byref(info))
        return FabricInfo(int(info.state), int(info.status), bytes(info.clusterUuid), int(info.cliqueId))

    def mig_mode(self, handle: Any) -> tuple[int, int]:
        current, pending = self._call(pynvml.nvmlDeviceGetMigMode, handle)
        return int(current), int(pending)

    def max_mig_devices(self, handle: Any) -> int:
        return int(self._call(pynvml.nvmlDeviceGetMaxMigDeviceCount, handle))

    def mig_handle(self, handle: Any, index: int) -> Any:
        return self._call(pynvml.nvmlDeviceGetMigDeviceHandleByIndex, handle, index)

    def mig_instance_ids(self, mig: Any) -> tuple[int, int]:
        return (
            int(self._call(pynvml.nvmlDeviceGetGpuInstanceId, mig)),
            int(self._call(pynvml.nvmlDeviceGetComputeInstanceId, mig)),
        )

    def mig_attributes(self, mig: Any) -> MigAttributes:
        a = self._call(pynvml.nvmlDeviceGetAttributes, mig)
        return MigAttributes(
            sm_count=int(a.multiprocessorCount),
            copy_engines=int(a.sharedCopyEngineCount),
            ofa=int(a.sharedOfaCount),
            jpeg=int(a.sharedJpegCount),
            gi_slices=int(a.gpuInstanceSliceCount),
            ci_slices=int(a.computeInstanceSliceCount),
        )

    def mig_profile_name(self, mig: Any) -> str:
        # GPU-instance profile info carries the name ("MIG 1g.10gb"); reading the instance needs
        # privileges on some systems (NO_PERMISSION), in which case the caller derives it.
        parent = self._call(pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle, mig)
        gi_id = self._call(pynvml.nvmlDeviceGetGpuInstanceId, mig)
        gi = self._call(pynvml.nvmlDeviceGetGpuInstanceById, parent, gi_id)
        info = self._call(pynvml.nvmlGpuInstanceGetInfo, gi)
        profile = self._call(pynvml.nvmlDeviceGetGpuInstanceProfileInfoById, parent, info.profileId)
        attrs = self.mig_attributes(mig)
        name = _str(profile.name).removeprefix("MIG ").strip()
        if not name:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if attrs.ci_slices is not None and attrs.gi_slices is not None and attrs.ci_slices < attrs.gi_slices:
            name = f"{attrs.ci_slices}c.{name}"
        return name

    def retired_pages(self, handle: Any) -> tuple[int, int]:
        pages = pynvml.nvmlDeviceGetRetiredPages
        sbe = self._call(pages, handle, pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS)
        dbe = self._call(pages, handle, pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
        return len(sbe), len(dbe)

    def retired_pages_pending(self, handle: Any) -> bool:
        return bool(self._call(pynvml.nvmlDeviceGetRetiredPagesPendingStatus, handle))

    def remapped_rows(self, handle: Any) -> tuple[int, int, bool, bool]:
        corr, unc, pending, failure = self._call(pynvml.nvmlDeviceGetRemappedRows, handle)
        return int(corr), int(unc), bool(pending), bool(failure)

    def row_remapper_histogram(self, handle: Any) -> dict[str, int]:
        values = self._call(pynvml.nvmlDeviceGetRowRemapperHistogram, handle)
        return {bucket: int(getattr(values, bucket)) for bucket in smi.HISTOGRAM_BUCKETS}

    def memory_error_counter(self, handle: Any, error_type: int, counter_type: int, location: int) -> int:
        return int(self._call(pynvml.nvmlDeviceGetMemoryErrorCounter, handle, error_type, counter_type, location))

    def sram_threshold_exceeded(self, handle: Any) -> bool:
        status = pynvml.c_nvmlEccSramErrorStatus_v1_t()
        status.version = pynvml.nvmlEccSramErrorStatus_v1
        self._call(pynvml.nvmlDeviceGetSramEccErrorStatus, handle, ctypes.byref(status))
        return bool(status.bThresholdExceeded)

    def ecc_volatile_uncorrected(self, handle: Any) -> int:
        kind, counter = pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC
        return int(self._call(pynvml.nvmlDeviceGetTotalEccErrors, handle, kind, counter))

    def temperature_c(self, handle: Any) -> int:
        return int(self._call(pynvml.nvmlDeviceGetTemperature, handle, pynvml.NVML_TEMPERATURE_GPU))

    def power_mw(self, handle: Any) -> int:
        return int(self._call(pynvml.nvmlDeviceGetPowerUsage, handle))

    def utilization_pct(self, handle: Any) -> int:
        return int(self._call(pynvml.nvmlDeviceGetUtilizationRates, handle).gpu)

    def process_pids(self, handle: Any) -> list[int]:
        pids = {int(p.pid) for p in self._call(pynvml.nvmlDeviceGetComputeRunningProcesses, handle)}
        with contextlib.suppress(pynvml.NVMLError_NotSupported):
            pids |= {int(p.pid) for p in self._call(pynvml.nvmlDeviceGetGraphicsRunningProcesses, handle)}
        return sorted(pids)

    def nvlink_p2p(self, handle: Any, other: Any) -> bool:
        status = self._call(pynvml.nvmlDeviceGetP2PStatus, handle, other, pynvml.NVML_P2P_CAPS_INDEX_NVLINK)
        return int(status) == pynvml.NVML_P2P_STATUS_OK

    def xid_event_set(self, handles: list[Any]) -> Any:
        """nvmlEventSetCreate, then nvmlDeviceRegisterEvents(XidCriticalError) on each card that allows it.

        Raises NOT_SUPPORTED when no card does (a driver or a card without events): the kernel log is read then.
        """
        event_set = self._call(pynvml.nvmlEventSetCreate)
        registered = 0
        for handle in handles:
            try:
                self._call(pynvml.nvmlDeviceRegisterEvents, handle, pynvml.nvmlEventTypeXidCriticalError, event_set)
                registered += 1
            except pynvml.NVMLError:
                continue  # this card refuses (MIG mode on some drivers); the others may not
        if not registered:
            self.free_event_set(event_set)
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return event_set

    def wait_xid(self, event_set: Any, timeout_ms: int) -> tuple[str, int] | None:
        """One Xid: the card's PCI bus id and the code (nvmlEventSetWait_v2); None when none came in time."""
        try:
            data = self._call(pynvml.nvmlEventSetWait_v2, event_set, timeout_ms)
        except pynvml.NVMLError_Timeout:
            return None
        if int(data.eventType) != pynvml.nvmlEventTypeXidCriticalError:
            return None
        return self.pci_bus_id(data.device), int(data.eventData)

    def free_event_set(self, event_set: Any) -> None:
        self._call(pynvml.nvmlEventSetFree, event_set)


# ---------------------------------------------------------------------------
# reading cards


def fabric_from_nvml(info: FabricInfo) -> fabric_facts.FabricFacts:
    """Fabric facts from NVML's struct, in the same words nvidia-smi uses."""
    facts = fabric_facts.FabricFacts(state=_STATE_TEXT.get(info.state, f"state {info.state}"))
    if info.state == 3:
        facts.status = _RETURN_TEXT.get(info.status, f"NVML error {info.status}")
        facts.clique_id = info.clique_id
        facts.cluster_uuid = str(uuidlib.UUID(bytes=bytes(info.cluster_uuid[:16]).ljust(16, b"\0")))
    if info.health_summary is not None:
        facts.summary = _SUMMARY_TEXT.get(info.health_summary)
    if info.health_mask is not None:
        mask = info.health_mask

        def get(key: str) -> int:
            shift, width = _MASK[key]
            return (mask >> shift) & width

        def tri(key: str) -> bool | None:
            return {1: True, 2: False}.get(get(key))

        facts.bandwidth = {1: "Degraded", 2: "Full"}.get(get("degraded_bw"))
        facts.route_recovery = tri("route_recovery")
        facts.route_unhealthy = tri("route_unhealthy")
        facts.access_timeout_recovery = tri("access_timeout_recovery")
        facts.incorrect_configuration = _INCORRECT_TEXT.get(get("incorrect_configuration"))
        facts.partition_assigned = tri("partition_assigned")
        facts.fabric_manager_connected = {1: True, 2: False}.get(get("gfm_state"))
    return facts


class _Reader:
    """Reads one card, turning each failed call into an unknown value and, where it matters, a problem."""

    def __init__(self, api: NvmlApi, card: G.CardFacts, problems: list[str]) -> None:
        self.api, self.card, self.problems = api, card, problems
        self.last_code: int | None = None  # NVML return code of the last failed call, None after a success

    @property
    def not_supported(self) -> bool:
        """Whether the last call failed because the card does not support it (a fact, not an unknown)."""
        return self.last_code == pynvml.NVML_ERROR_NOT_SUPPORTED

    def __call__(self, fn: Callable[..., T], *args: Any, what: str = "") -> T | None:
        self.last_code = None
        try:
            return fn(*args)
        except pynvml.NVMLError as exc:
            code = getattr(exc, "value", None)
            self.last_code = code
            if code == pynvml.NVML_ERROR_GPU_IS_LOST:
                if smi.GPU_LOST not in self.card.errors:
                    self.card.errors.append(smi.GPU_LOST)
                    self.problems.append(f"gpu {self.card.index}: NVML: GPU is lost")
            elif (
                code
                not in (
                    pynvml.NVML_ERROR_NOT_SUPPORTED,
                    pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
                    pynvml.NVML_ERROR_NOT_FOUND,
                )
                and what
            ):
                self.problems.append(f"gpu {self.card.index}: NVML: {what}: {error_text(exc)}")
            return None


def _read_card(api: NvmlApi, index: int, problems: list[str]) -> tuple[G.CardFacts, Any]:
    card = G.CardFacts(index=index)
    read = _Reader(api, card, problems)
    h = read(api.handle, index, what="handle")
    if h is None:
        return card, None
    card.name = read(api.name, h, what="name")
    card.uuid = read(api.uuid, h, what="uuid")
    card.pci_bus = smi.normalize_bus_id(read(api.pci_bus_id, h, what="PCI bus id"))
    card.memory_mib = read(api.memory_total_mib, h, what="memory")
    numa = read(api.numa_node, h)
    card.numa = numa if numa is not None and numa >= 0 else None

    info = read(api.fabric_info, h, what="fabric")
    if info is not None:
        card.fabric = fabric_from_nvml(info)
    elif read.not_supported:
        card.fabric = fabric_facts.FabricFacts(state="Not Supported")

    mode = read(api.mig_mode, h, what="MIG mode")
    if mode is not None:
        card.mig_mode = G.mig_mode_name(bool(mode[0]), bool(mode[1]))
    elif read.not_supported:
        card.mig_mode = "not supported"
    if card.mig_mode is not None and card.mig_mode.startswith("enabled"):
        card.migs = _read_migs(api, h, read)

    retired = read(api.retired_pages, h, what="retired pages")
    if retired is not None:
        card.retired_sbe, card.retired_dbe = retired
    card.retired_pending = read(api.retired_pages_pending, h, what="retired pages pending")
    remap = read(api.remapped_rows, h, what="remapped rows")
    if remap is not None:
        card.remap_correctable, card.remap_uncorrectable, card.remap_pending, card.remap_failure = remap
    card.remap_histogram = read(api.row_remapper_histogram, h) or None
    card.ecc = _read_ecc(api, h, read)
    card.ecc_volatile_uncorrectable = read(api.ecc_volatile_uncorrected, h, what="ECC")
    card.temperature_c = read(api.temperature_c, h)
    power = read(api.power_mw, h)
    card.power_w = None if power is None else round(power / 1000, 2)
    card.utilization_pct = read(api.utilization_pct, h)
    pids = read(api.process_pids, h)
    card.processes = None if pids is None else len(set(pids))
    return card, h


# NVML's older memory locations, summed where the driver has no SRAM counter.
_LEGACY_LOCATION = {
    pynvml.NVML_MEMORY_LOCATION_L1_CACHE: "l1_cache",
    pynvml.NVML_MEMORY_LOCATION_L2_CACHE: "l2_cache",
    pynvml.NVML_MEMORY_LOCATION_REGISTER_FILE: "register_file",
    pynvml.NVML_MEMORY_LOCATION_TEXTURE_MEMORY: "texture_memory",
    pynvml.NVML_MEMORY_LOCATION_TEXTURE_SHM: "texture_shm",
    pynvml.NVML_MEMORY_LOCATION_CBU: "cbu",
}


_ECC_KINDS = (
    ("correctable", pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED),
    ("uncorrectable", pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED),
)
_ECC_COUNTER_TYPES = (("volatile", pynvml.NVML_VOLATILE_ECC), ("aggregate", pynvml.NVML_AGGREGATE_ECC))


def _read_ecc(api: NvmlApi, h: Any, read: _Reader) -> G.EccCounts | None:
    """ECC counters per memory (SRAM, DRAM); pre-Turing SRAM is the sum of the on-chip locations."""
    ecc = G.EccCounts(sram_threshold_exceeded=read(api.sram_threshold_exceeded, h))
    for section, counter_type in _ECC_COUNTER_TYPES:
        counts = getattr(ecc, section)
        for kind, error_type in _ECC_KINDS:
            dram = read(api.memory_error_counter, h, error_type, counter_type, pynvml.NVML_MEMORY_LOCATION_DRAM)
            if dram is not None:
                counts[f"dram_{kind}"] = dram
            sram = read(api.memory_error_counter, h, error_type, counter_type, pynvml.NVML_MEMORY_LOCATION_SRAM)
            if sram is None:
                legacy = [read(api.memory_error_counter, h, error_type, counter_type, loc) for loc in _LEGACY_LOCATION]
                known = [v for v in legacy if v is not None]
                sram = sum(known) if known else None
            if sram is not None:
                counts[f"sram_{kind}"] = sram
    return ecc if ecc.known() else None


def _read_migs(api: NvmlApi, h: Any, read: _Reader) -> list[G.MigFacts] | None:
    count = read(api.max_mig_devices, h, what="MIG devices")
    if count is None:
        return None
    migs = []
    for device in range(count):
        m = read(api.mig_handle, h, device)  # NOT_FOUND: no instance at this index
        if m is None:
            continue
        mig = G.MigFacts(device=device)
        mig.mig_uuid = read(api.uuid, m)
        mig.profile = read(api.mig_profile_name, m)
        mig.memory_mib = read(api.memory_total_mib, m, what=f"mig{device} memory")
        ids = read(api.mig_instance_ids, m)
        if ids is not None:
            mig.gpu_instance_id, mig.compute_instance_id = ids
        attrs = read(api.mig_attributes, m)
        if attrs is not None:
            mig.sm_count, mig.copy_engines, mig.ofa = attrs.sm_count, attrs.copy_engines, attrs.ofa
            mig.gi_slices, mig.ci_slices = attrs.gi_slices, attrs.ci_slices
        pids = read(api.process_pids, m)
        mig.processes = None if pids is None else len(set(pids))
        mig.ecc_uncorrectable = read(api.ecc_volatile_uncorrected, m)
        migs.append(mig)
    return migs


@dataclass
class NvmlReading:
    cards: list[G.CardFacts]
    problems: list[str]
    driver_version: str | None = None
    cuda_version: str | None = None


def read_cards(api: NvmlApi) -> NvmlReading:
    """Read every card through an initialised NvmlApi. Never raises NVMLError: failures become problems."""
    problems: list[str] = []
    reading = NvmlReading(cards=[], problems=problems)
    try:
        reading.driver_version = api.driver_version()
    except pynvml.NVMLError as exc:
        problems.append(f"NVML: driver version: {error_text(exc)}")
    with contextlib.suppress(pynvml.NVMLError):
        reading.cuda_version = api.cuda_version()
    try:
        count = api.device_count()
    except pynvml.NVMLError as exc:
        problems.append(f"NVML: device count: {error_text(exc)}")
        return reading
    handles: list[tuple[G.CardFacts, Any]] = [_read_card(api, i, problems) for i in range(count)]
    reading.cards = [c for c, _ in handles]
    _nvlink_peers(api, handles)
    return reading


def _nvlink_peers(api: NvmlApi, handles: list[tuple[G.CardFacts, Any]]) -> None:
    """NVLink peers from NVML's P2P status; unknown for a card when any other card cannot be asked.

    P2P status is the NVML answer that holds on NVSwitch systems too, where a
    link's remote end is the switch rather than the peer card. A lone card has
    no peers, which is known without asking.
    """
    for card, h in handles:
        if h is None or card.errors:
            continue
        peers: list[int] | None = []
        for other, oh in handles:
            if other is card:
                continue
            if oh is None or other.errors:
                peers = None
                break
            try:
                if api.nvlink_p2p(h, oh):
                    peers.append(other.index)
            except pynvml.NVMLError:
                peers = None
                break
        card.nvlink_peers = peers
