"""The full discovery report: GPUs from NVML or nvidia-smi (or captures), merged with the node's other facts.

Where the GPU facts come from, in order:

1. captures (``Sources.nvidia_smi_xml`` / ``_text`` / ``_list``, with ``topo``):
   nothing live is consulted; ``gpu_source`` is ``"capture"``;
2. NVML, unless ``use_nvml`` is off; ``nvidia-smi topo -m`` adds NIC
   nearness (NVML cannot say it); ``gpu_source`` is ``"nvml"``;
3. ``nvidia-smi -q -x`` (+ ``-L`` and ``topo -m``); ``gpu_source`` is
   ``"nvidia-smi"``;
4. nothing: ``gpus`` is ``[]``, ``gpu_source`` is ``"none"`` and problems say
   why. A machine without GPUs is a CPU node, not an error.

The report is plain JSON. A key that is absent means *unknown*; ``[]`` and
``0`` are facts. ``problems`` lists, in words, every source that failed and
everything found wrong, GPU part first, then the node part.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from agent.discovery import gpus as G
from agent.discovery import nvidia_smi as smi
from agent.discovery import nvml as N
from agent.discovery import xids as xid_log
from agent.discovery.errors import DiscoveryError
from agent.discovery.sources import Sources
from agent.discovery.tools import ToolOutput, run_tool
from agent.discovery.topo import Topology, parse_topo

SCHEMA = 1
Run = Callable[[list[str]], ToolOutput]


def agent_version() -> str | None:
    try:
        return importlib.metadata.version("llmgw")
    except importlib.metadata.PackageNotFoundError:
        return None


@dataclass
class GpuSection:
    """The GPU half of the report, with what could not be read kept apart for the CLI's exit status."""

    source: str = "none"
    gpus: list[dict[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    driver_version: str | None = None
    cuda_version: str | None = None
    unreadable: list[str] = field(default_factory=list)  # "cannot read <file>: <why>" for each capture that failed
    read: list[str] = field(default_factory=list)  # captures that were read


# ---------------------------------------------------------------------------
# captures


def _read_capture(path: Path, parse: Callable[[str], Any], section: GpuSection) -> Any:
    """Read and parse one capture file; a failure is recorded, never raised."""
    try:
        text = path.read_text(errors="replace")
        result = parse(text)
    except OSError as exc:
        section.unreadable.append(f"cannot read {path}: {exc.strerror or exc}")
        return None
    except DiscoveryError as exc:
        section.unreadable.append(f"cannot read {path}: {exc}")
        return None
    section.read.append(str(path))
    return result


def _from_captures(sources: Sources, section: GpuSection) -> tuple[list[G.CardFacts], Topology | None]:
    section.source = "capture"
    log = None
    if sources.nvidia_smi_xml is not None:
        log = _read_capture(sources.nvidia_smi_xml, smi.parse_xml, section)
    if log is None and sources.nvidia_smi_text is not None:
        log = _read_capture(sources.nvidia_smi_text, smi.parse_text, section)
    listing = None
    if sources.nvidia_smi_list is not None:
        listing = _read_capture(sources.nvidia_smi_list, smi.parse_list, section)
    topo = _read_capture(sources.topo, parse_topo, section) if sources.topo is not None else None

    cards: list[G.CardFacts] = []
    if log is not None:
        cards, problems = G.cards_from_smi(log)
        section.problems.extend(problems)
        section.driver_version, section.cuda_version = log.driver_version, log.cuda_version
        if listing is not None:
            section.problems.extend(G.apply_listing(cards, listing))
    elif listing is not None:
        cards = G.cards_from_listing(listing)
        section.problems.append("only nvidia-smi -L was readable: GPU memory, class, fabric and health are unknown")
    return cards, topo


# ---------------------------------------------------------------------------
# live


def _live_topology(run: Run, section: GpuSection) -> Topology | None:
    out = run(["nvidia-smi", "topo", "-m"])
    if out.stdout is None or out.error:
        section.problems.append(f"nvidia-smi topo -m: {out.error} (NVLink peers and NIC nearness unknown)")
        return None
    try:
        return parse_topo(out.stdout)
    except DiscoveryError as exc:
        section.problems.append(f"nvidia-smi topo -m: {exc}")
        return None


def _from_nvml(api: N.NvmlApi, run: Run, section: GpuSection) -> tuple[list[G.CardFacts], Topology | None] | None:
    """Cards through NVML, or None (with the reason in problems) when NVML cannot be loaded."""
    try:
        api.init()
    except N.pynvml.NVMLError as exc:
        section.problems.append(f"NVML: {N.error_text(exc)}")
        return None
    try:
        reading = N.read_cards(api)
    finally:
        with contextlib.suppress(N.pynvml.NVMLError):
            api.shutdown()
    section.source = "nvml"
    section.problems.extend(reading.problems)
    section.driver_version, section.cuda_version = reading.driver_version, reading.cuda_version
    topo = _live_topology(run, section) if reading.cards else None
    return reading.cards, topo


def _from_nvidia_smi(run: Run, section: GpuSection) -> tuple[list[G.CardFacts], Topology | None]:
    out = run(["nvidia-smi", "-q", "-x"])
    if out.stdout is None or (out.error and not out.stdout.strip()):
        section.problems.append(out.error or "nvidia-smi printed nothing")
        return [], None
    if out.error:
        section.problems.append(out.error)
    try:
        log = smi.parse_xml(out.stdout)
    except DiscoveryError as exc:
        section.problems.append(str(exc))
        return [], None
    section.source = "nvidia-smi"
    cards, problems = G.cards_from_smi(log)
    section.problems.extend(problems)
    section.driver_version, section.cuda_version = log.driver_version, log.cuda_version
    if any(c.mig_mode and c.mig_mode.startswith("enabled") for c in cards):
        # -q -x names neither the MIG profiles nor the MIG UUIDs; -L does.
        listed = run(["nvidia-smi", "-L"])
        if listed.stdout and not listed.error:
            try:
                section.problems.extend(G.apply_listing(cards, smi.parse_list(listed.stdout)))
            except DiscoveryError as exc:
                section.problems.append(str(exc))
        else:
            section.problems.append(f"nvidia-smi -L: {listed.error}")
    topo = _live_topology(run, section) if cards else None
    return cards, topo


def sysfs_bus_id(pci_bus: str) -> str:
    """NVML's ``00000000:18:00.0`` as sysfs names it: ``0000:18:00.0``, lower case."""
    domain, rest = pci_bus.split(":", 1)
    return f"{int(domain, 16):04x}:{rest.lower()}"


def _sysfs_numa(cards: list[G.CardFacts], sysfs_root: Path) -> None:
    for card in cards:
        if card.numa is not None or card.pci_bus is None:
            continue
        try:
            value = int((sysfs_root / "bus" / "pci" / "devices" / sysfs_bus_id(card.pci_bus) / "numa_node").read_text())
        except (OSError, ValueError):
            continue
        if value >= 0:  # -1: the kernel does not know (single-node machines, many VMs)
            card.numa = value


# ---------------------------------------------------------------------------


def collect_gpus(
    sources: Sources, *, nvml_api: N.NvmlApi | None = None, run: Run = run_tool, kernel_log: str | None = None
) -> GpuSection:
    """The GPU section from the first source that answers (see the module docstring).

    ``kernel_log`` is dmesg text, when the caller could read it (it needs
    privileges the agent may lack): its Xid errors go into each card's health.
    """
    section = GpuSection()
    topo: Topology | None = None
    cards: list[G.CardFacts] = []
    if sources.replaying_gpus:
        cards, topo = _from_captures(sources, section)
        section.problems.extend(section.unreadable)
    else:
        if sources.topo is not None:  # a topo capture alone still replaces the live topo -m
            topo = _read_capture(sources.topo, parse_topo, section)
            section.problems.extend(section.unreadable)
        got = None
        if sources.use_nvml:
            got = _from_nvml(nvml_api or N.PynvmlApi(), run, section)
        if got is None:
            got = _from_nvidia_smi(run, section)
        cards, live_topo = got
        topo = topo or live_topo
    if topo is not None:
        section.problems.extend(G.apply_topology(cards, topo))
    if not sources.replaying_gpus or sources.sysfs_root != Path("/sys"):
        _sysfs_numa(cards, sources.sysfs_root)
    if kernel_log:
        section.problems.extend(xid_log.apply_xids(cards, xid_log.parse_xid_log(kernel_log)))
    section.gpus, problems = G.entries(cards)
    section.problems.extend(problems)
    return section


def _collect_node(sources: Sources, run: Run, sampler: Any = None) -> dict[str, Any]:
    """The other half of the report (host, IMEX, InfiniBand, disks, engines, weights); imported lazily."""
    try:
        from agent.discovery.node import collect_node
    except ImportError as exc:
        return {"problems": [f"node facts not collected: {exc}"]}
    try:
        return dict(collect_node(sources, run=run, sampler=sampler))
    except DiscoveryError as exc:
        return {"problems": [f"node facts not collected: {exc}"]}


def build_report(
    sources: Sources,
    *,
    nvml_api: N.NvmlApi | None = None,
    run: Run = run_tool,
    now: datetime | None = None,
    node: bool = True,
    section: GpuSection | None = None,
    kernel_log: str | None = None,
    sampler: Any = None,
) -> dict[str, Any]:
    """The whole report as a JSON-able dict. Never raises for bad input: every failure is a problem.

    ``section`` is a GPU section already collected (the CLI looks at it first to
    tell "nothing readable" apart); ``node=False`` leaves out the node half.
    ``sampler`` is the agent's long-lived LoadSampler: passed on every report,
    it lets CPU use be measured between them (without it, CPU use is unknown).
    """
    if section is None:
        section = collect_gpus(sources, nvml_api=nvml_api, run=run, kernel_log=kernel_log)
    report: dict[str, Any] = {"schema": SCHEMA}
    version = agent_version()
    if version:
        report["agent_version"] = version
    report["collected_at"] = (now or datetime.now(UTC)).isoformat(timespec="seconds")
    if section.driver_version:
        report["driver_version"] = section.driver_version
    if section.cuda_version:
        report["cuda_version"] = section.cuda_version
    report["gpu_source"] = section.source
    report["gpus"] = section.gpus
    problems = list(section.problems)
    if node:
        for key, value in _collect_node(sources, run, sampler).items():
            if key == "problems":
                problems.extend(value or [])
            elif key not in report:
                report[key] = value
    report["problems"] = problems
    return report
