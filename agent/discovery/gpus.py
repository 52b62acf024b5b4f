"""Turning what NVML or nvidia-smi said into the report's GPU entries.

Both sources are first brought into :class:`CardFacts` (typed values, ``None``
for unknown); one function, :func:`entries`, turns facts into report entries,
so the NVML and the nvidia-smi paths cannot drift apart in how they name,
number or judge a card.

Decisions (see also docs in the report module):

* **Class** is ``<model>-<GiB>g``: the product name lower-cased with vendor,
  marketing, form-factor and memory tokens dropped, and the memory rounded to
  whole GiB (``NVIDIA GB200`` with 189471 MiB is ``gb200-185g``). Unknown
  memory (a lost card) means no class, not a guessed one.
* **MIG**: a card in MIG mode is reported as its instances, numbered
  ``1000 + 100 × card + device`` (``device`` being the MIG device index that
  ``nvidia-smi -L`` prints as "Device N"), labelled ``card/migN``. An
  instance's ``uuid`` is its own ``MIG-…`` UUID (what CUDA_VISIBLE_DEVICES
  takes) and is absent when no source gave it; the card's UUID is in
  ``parent_uuid``. Instances carry no temperature, power or utilisation: those
  belong to the card. A card in MIG mode with no instance is reported as the
  card, with the reason in its health.
* **Memory health** (``ecc``, ``remapped_rows``, ``retired_pages``) is
  reported as the counters the driver keeps, whichever source read them:
  ECC counts volatile (since the last reset) and aggregate (the card's
  life) for SRAM and DRAM, correctable and uncorrectable; the row remapper's
  counts, flags and bank availability; retired pages. A counter that is
  non-zero but settled (a row remapped with nothing pending, pages retired
  long ago) is a fact, not a health problem; only what needs a reset or
  service goes into ``health``. On pre-Turing cards, which count ECC per
  location, DRAM is "Device Memory" and SRAM the sum of the on-chip
  locations (register file, L1, L2, texture, texture shared, CBU).
* **Fabric**: a card whose driver says fabric is not supported gets
  ``{"state": "Not Supported"}``; ``fabric`` is absent only when unknown (an
  old driver without the fabric query, a lost card). ``cluster_uuid``,
  ``clique_id`` and ``status`` are reported only once the state is Completed,
  because NVML defines them only then.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from agent.discovery import nvidia_smi as smi
from agent.discovery.fabric_facts import FabricFacts, fabric_from_smi, fabric_report
from agent.discovery.topo import Topology

ZERO_UUID = "00000000-0000-0000-0000-000000000000"
MIG_BASE = 1000

# ---------------------------------------------------------------------------
# class names

# Tokens that say who sells the card or how it is packaged, not what it is.
_DROP = {
    "nvidia",
    "tesla",
    "geforce",
    "quadro",
    "pcie",
    "pci",
    "e",  # "PCI-E"
    "hbm",
    "hbm2",
    "hbm2e",
    "hbm3",
    "hbm3e",
    "generation",
    "edition",
    "workstation",
    "server",
    "maxq",
}
_DROP_PATTERNS = (re.compile(r"^sxm\d*$"), re.compile(r"^\d+g(b)?$"))


def model_part(name: str | None) -> str | None:
    """The model part of a class: ``NVIDIA A100-SXM4-80GB`` -> ``a100``, ``NVIDIA RTX A5000`` -> ``rtx-a5000``."""
    if not name or smi.is_missing(name):
        return None
    text = name.lower().replace("max-q", "maxq")
    tokens = [re.sub(r"[^a-z0-9.]", "", t) for t in re.split(r"[\s\-_/,()]+", text)]
    kept = [t for t in tokens if t and t not in _DROP and not any(p.match(t) for p in _DROP_PATTERNS)]
    return "-".join(kept) or None


def memory_gib(memory_mib: int | None) -> int | None:
    """Whole GiB, rounding half up (a card never reports exactly its marketing size)."""
    if memory_mib is None or memory_mib <= 0:
        return None
    return int(memory_mib / 1024 + 0.5)


def gpu_class(name: str | None, memory_mib: int | None) -> str | None:
    """``h100-80g``; None when either part is unknown."""
    model, gib = model_part(name), memory_gib(memory_mib)
    if model is None or gib is None:
        return None
    return f"{model}-{gib}g"


# ---------------------------------------------------------------------------
# MIG profiles
#
# ``nvidia-smi -q -x`` gives an instance's SM count, shared engines and memory
# but not its profile name. The name is "<slices>g.<GB>gb": GB is the share of
# the card's memory in eighths times the card's size, and slices follow from
# the SM count -- but SMs per slice differ per chip, so we only derive names
# for chips whose shapes we know, and we check the copy-engine count (one per
# slice) so that a compute instance smaller than its GPU instance ("1c.2g.20gb")
# is never mistaken for a whole one.

_AMPERE_100 = {(14, 1): 1, (14, 2): 1, (28, 2): 2, (42, 4): 3, (56, 4): 4, (98, 8): 7}
_HOPPER = {(16, 1): 1, (26, 2): 1, (32, 2): 2, (60, 4): 3, (64, 4): 4, (132, 8): 7}
_MIG_SHAPES: dict[str, dict[tuple[int, int], int]] = {
    "a100": _AMPERE_100,
    "a800": _AMPERE_100,
    "a30": {(14, 2): 1, (28, 4): 2, (56, 8): 4},
    "h100": _HOPPER,
    "h800": _HOPPER,
    "gh200": _HOPPER,
}


def derive_mig_profile(card_name: str | None, card_mib: int | None, mig: MigFacts) -> str | None:
    """The profile name of an instance from its counts, or None when that cannot be done reliably."""
    shapes = _MIG_SHAPES.get(model_part(card_name) or "")
    card_gib = memory_gib(card_mib)
    if not shapes or card_gib is None or mig.sm_count is None or mig.memory_mib is None or card_mib is None:
        return None
    if mig.gi_slices is not None and mig.ci_slices is not None and mig.ci_slices < mig.gi_slices:
        return None
    eighths = round(mig.memory_mib * 8 / card_mib)
    slices = shapes.get((mig.sm_count, eighths))
    if slices is None:
        return None
    if mig.gi_slices is not None and mig.gi_slices != slices:
        return None
    if slices < 7 and mig.copy_engines is not None and mig.copy_engines != slices:
        return None
    gb = int(eighths * card_gib / 8 + 0.5)
    media = "+me" if slices == 1 and (mig.ofa or 0) > 0 else ""
    return f"{slices}g.{gb}gb{media}"


# ---------------------------------------------------------------------------
# facts


@dataclass
class MigFacts:
    """One MIG instance; ``device`` is the MIG device index ("Device N")."""

    device: int
    mig_uuid: str | None = None
    profile: str | None = None
    memory_mib: int | None = None
    sm_count: int | None = None
    copy_engines: int | None = None
    ofa: int | None = None
    gi_slices: int | None = None
    ci_slices: int | None = None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    processes: int | None = None
    ecc_uncorrectable: int | None = None


# ---------------------------------------------------------------------------
# memory health

ECC_COUNTERS = ("sram_correctable", "sram_uncorrectable", "dram_correctable", "dram_uncorrectable")
ECC_SECTIONS = ("volatile", "aggregate")
# Pre-Turing per-location counters that are on-chip SRAM (NVML's nvmlMemoryLocation_t less DRAM).
LEGACY_SRAM_LOCATIONS = ("register_file", "l1_cache", "l2_cache", "texture_memory", "texture_shm", "cbu")
# NVIDIA's "GPU Memory Error Management": page retirement (pre-Ampere) supports at most 64
# retirements for the frame buffer; a card there cannot retire another page.
RETIRED_PAGES_LIMIT = 64


@dataclass
class EccCounts:
    """ECC error counters: section ("volatile"/"aggregate") → counter → count; unknown counters are absent."""

    volatile: dict[str, int] = field(default_factory=dict)
    aggregate: dict[str, int] = field(default_factory=dict)
    sram_threshold_exceeded: bool | None = None

    def known(self) -> bool:
        return bool(self.volatile or self.aggregate) or self.sram_threshold_exceeded is not None


def _legacy_bit(kind: str) -> str:
    return "single_bit" if kind == "correctable" else "double_bit"


def _ecc_counter_smi(raw: dict[str, str], section: str, counter: str) -> int | None:
    memory, kind = counter.split("_", 1)
    if memory == "dram":
        key = f"{section}.{counter}"
        return smi.integer(raw[key] if key in raw else raw.get(f"{section}.{_legacy_bit(kind)}.device_memory"))
    if f"{section}.{counter}" in raw:
        return smi.integer(raw[f"{section}.{counter}"])
    split = [raw[k] for k in (f"{section}.{counter}_parity", f"{section}.{counter}_secded") if k in raw]
    if split:  # Hopper-era drivers split SRAM uncorrectable into parity and SEC-DED
        return _sum_known(split)
    legacy = [raw[k] for n in LEGACY_SRAM_LOCATIONS if (k := f"{section}.{_legacy_bit(kind)}.{n}") in raw]
    return _sum_known(legacy)


def ecc_from_smi(raw: dict[str, str] | None) -> EccCounts | None:
    """ECC counters from nvidia-smi's flattened ECC block; None when it holds no readable counter."""
    if not raw:
        return None
    ecc = EccCounts(sram_threshold_exceeded=smi.yes_no(raw.get("aggregate.sram_threshold_exceeded")))
    for section in ECC_SECTIONS:
        counts = getattr(ecc, section)
        for counter in ECC_COUNTERS:
            value = _ecc_counter_smi(raw, section, counter)
            if value is not None:
                counts[counter] = value
    return ecc if ecc.known() else None


def histogram_from_smi(raw: dict[str, str] | None) -> dict[str, int] | None:
    """Bank remap availability ("192 bank(s)" → 192); None when unknown."""
    if raw is None:
        return None
    out = {bucket: v for bucket, text in raw.items() if (v := smi.integer(text)) is not None}
    return out or None


@dataclass
class CardFacts:
    """Everything known about one card. ``None`` is unknown; ``errors`` are read failures ("GPU is lost")."""

    index: int
    name: str | None = None
    uuid: str | None = None
    pci_bus: str | None = None
    memory_mib: int | None = None
    mig_mode: str | None = None
    migs: list[MigFacts] | None = None
    fabric: FabricFacts | None = None
    retired_sbe: int | None = None
    retired_dbe: int | None = None
    retired_pending: bool | None = None
    remap_pending: bool | None = None
    remap_failure: bool | None = None
    remap_correctable: int | None = None
    remap_uncorrectable: int | None = None
    remap_histogram: dict[str, int] | None = None
    ecc: EccCounts | None = None
    ecc_volatile_uncorrectable: int | None = None
    temperature_c: int | None = None
    power_w: float | None = None
    utilization_pct: int | None = None
    processes: int | None = None
    numa: int | None = None
    nvlink_peers: list[int] | None = None
    nics: dict[str, str] | None = None
    errors: list[str] = field(default_factory=list)


def mig_mode_name(current: bool | None, pending: bool | None) -> str | None:
    """``enabled``, ``disabled``, or e.g. ``enabled (pending disable)`` when a change waits for a reset."""
    if current is None:
        return None
    now = "enabled" if current else "disabled"
    if pending is None or pending == current:
        return now
    return f"{now} (pending {'enable' if pending else 'disable'})"


def _mig_mode_smi(current: str | None, pending: str | None) -> str | None:
    if current is None or smi.is_lost(current):
        return None
    if current.strip().upper() == "N/A":
        return "not supported"
    return mig_mode_name(smi.yes_no(current), smi.yes_no(pending))


def _count_pids(processes: list[smi.SmiProcess]) -> int:
    return len({p.pid for p in processes if p.pid and not smi.is_missing(p.pid)})


def _mig_from_smi(dev: smi.SmiMigDevice, processes: list[smi.SmiProcess] | None) -> MigFacts:
    gi, ci = smi.integer(dev.gpu_instance_id), smi.integer(dev.compute_instance_id)
    count = None
    if processes is not None:
        count = _count_pids([p for p in processes if instance_of(p) == (gi, ci)])
    return MigFacts(
        device=dev.index,
        memory_mib=smi.integer(dev.memory_total),
        sm_count=smi.integer(dev.sm_count),
        copy_engines=smi.integer(dev.copy_engines),
        ofa=smi.integer(dev.ofa),
        gpu_instance_id=gi,
        compute_instance_id=ci,
        processes=count,
        ecc_uncorrectable=smi.integer(dev.ecc_uncorrectable),
    )


def instance_of(process: smi.SmiProcess) -> tuple[int | None, int | None]:
    """The (GPU instance, compute instance) a process runs in; (None, None) outside MIG."""
    return smi.integer(process.gpu_instance_id), smi.integer(process.compute_instance_id)


def _sum_known(raws: list[str]) -> int | None:
    values = [smi.integer(r) for r in raws]
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def card_from_smi(index: int, gpu: smi.SmiGpu) -> CardFacts:
    """Facts from one nvidia-smi card (XML or text)."""
    card = CardFacts(
        index=index,
        name=None if smi.is_missing(gpu.name) else gpu.name,
        uuid=None if smi.is_missing(gpu.uuid) else gpu.uuid,
        pci_bus=smi.normalize_bus_id(gpu.pci_bus_id),
        memory_mib=smi.integer(gpu.memory_total),
        mig_mode=_mig_mode_smi(gpu.mig_current, gpu.mig_pending),
        fabric=fabric_from_smi(gpu.fabric),
        retired_sbe=smi.integer(gpu.retired_sbe),
        retired_dbe=smi.integer(gpu.retired_dbe),
        retired_pending=smi.yes_no(gpu.retired_pending),
        remap_pending=smi.yes_no(gpu.remap_pending),
        remap_failure=smi.yes_no(gpu.remap_failure),
        remap_correctable=smi.integer(gpu.remap_correctable),
        remap_uncorrectable=smi.integer(gpu.remap_uncorrectable),
        remap_histogram=histogram_from_smi(gpu.remap_histogram),
        ecc=ecc_from_smi(gpu.ecc_counters),
        ecc_volatile_uncorrectable=_sum_known(gpu.ecc_volatile_uncorrectable),
        temperature_c=smi.integer(gpu.temperature),
        power_w=_watts(smi.number(gpu.power_draw)),
        utilization_pct=smi.integer(gpu.gpu_util),
    )
    if gpu.processes is not None:
        card.processes = _count_pids(gpu.processes)
    if gpu.mig_devices is not None and card.mig_mode is not None and card.mig_mode.startswith("enabled"):
        card.migs = [_mig_from_smi(d, gpu.processes) for d in gpu.mig_devices]
    elif card.mig_mode is not None and card.mig_mode.startswith("enabled"):
        card.migs = None  # MIG on, but this capture does not list the instances: unknown
    if gpu.lost:
        card.errors.append(smi.GPU_LOST)
    return card


def _watts(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def cards_from_smi(log: smi.SmiLog) -> tuple[list[CardFacts], list[str]]:
    """Facts for every card of an nvidia-smi log, and the problems it shows."""
    cards = [card_from_smi(i, g) for i, g in enumerate(log.gpus)]
    if len(cards) == 1 and not cards[0].errors:
        cards[0].nvlink_peers = []  # a lone card has no peers, whatever the source can say
    problems = [f"gpu {c.index}: nvidia-smi: {e}" for c in cards for e in c.errors]
    if log.attached_gpus is not None and log.attached_gpus != len(log.gpus):
        problems.append(f"nvidia-smi says {log.attached_gpus} GPUs are attached but lists {len(log.gpus)}")
    return cards, problems


def cards_from_listing(listing: smi.SmiListing) -> list[CardFacts]:
    """Facts from ``nvidia-smi -L`` alone: names, UUIDs and MIG instances, nothing else."""
    cards = []
    for g in listing.gpus:
        card = CardFacts(index=g.index, name=g.name or None, uuid=g.uuid)
        if g.migs:
            card.mig_mode = "enabled"
            card.migs = [MigFacts(device=m.device, mig_uuid=m.uuid, profile=m.profile) for m in g.migs]
        cards.append(card)
    return cards


def apply_listing(cards: list[CardFacts], listing: smi.SmiListing) -> list[str]:
    """Add ``-L``'s MIG UUIDs and profile names to cards read elsewhere; cards match by UUID, else by index."""
    problems: list[str] = []
    by_uuid = {c.uuid: c for c in cards if c.uuid}
    by_index = {c.index: c for c in cards}
    for listed in listing.gpus:
        card = by_uuid.get(listed.uuid) if listed.uuid else None
        if card is None:
            card = by_index.get(listed.index)
            if card is None or (card.uuid and listed.uuid and card.uuid != listed.uuid):
                problems.append(f"nvidia-smi -L lists GPU {listed.index} ({listed.uuid}), the other source does not")
                continue
        if not listed.migs:
            continue
        if card.migs is None:
            card.migs = [MigFacts(device=m.device) for m in listed.migs]
        by_device = {m.device: m for m in card.migs}
        for m in listed.migs:
            mig = by_device.get(m.device)
            if mig is None:
                mig = MigFacts(device=m.device)
                card.migs.append(mig)
            mig.mig_uuid, mig.profile = m.uuid, m.profile
        card.migs.sort(key=lambda m: m.device)
    return problems


def apply_topology(cards: list[CardFacts], topo: Topology) -> list[str]:
    """Fill NVLink peers, NIC nearness and NUMA node from ``topo -m`` where the primary source left them unknown.

    Cards match by index. A matrix with a different number of GPUs was taken
    on another machine (or with a GPU missing): it is not applied at all.
    """
    if cards and len(topo.gpus) != len(cards):
        return [f"nvidia-smi topo -m lists {len(topo.gpus)} GPUs but the GPU source {len(cards)}: topology not used"]
    for card in cards:
        t = topo.gpus.get(card.index)
        if t is None:
            continue
        if card.nvlink_peers is None:
            card.nvlink_peers = sorted(t.nvlinks)
        if card.nics is None:
            card.nics = dict(t.nics)
        if card.numa is None:
            card.numa = t.numa
    return []


# ---------------------------------------------------------------------------
# health and entries


def health(card: CardFacts) -> list[str]:
    """What is wrong with a card, in words; [] means healthy as far as the source could tell."""
    problems = list(card.errors)
    if card.retired_pending:
        problems.append("retired pages pending (reset the GPU)")
    sbe, dbe = card.retired_sbe or 0, card.retired_dbe or 0
    # Pages retired and settled are a fact of the card's past (reported in retired_pages);
    # only the limit, past which no page can be retired, makes them a problem.
    if sbe + dbe >= RETIRED_PAGES_LIMIT:
        problems.append(
            f"{sbe + dbe} retired pages ({sbe} single-bit, {dbe} double-bit): NVIDIA's limit of "
            f"{RETIRED_PAGES_LIMIT} reached (the GPU needs service)"
        )
    if card.remap_failure:
        problems.append("row remapping failed (the GPU needs service)")
    if card.remap_pending:
        problems.append("row remapping pending (reset the GPU)")
    if card.ecc_volatile_uncorrectable:
        problems.append(f"{card.ecc_volatile_uncorrectable} uncorrectable ECC errors since the last reset")
    if card.ecc is not None and card.ecc.sram_threshold_exceeded:
        problems.append("SRAM uncorrectable errors over NVIDIA's threshold (run the field diagnostic)")
    if card.mig_mode is not None and card.mig_mode.startswith("enabled") and card.migs == []:
        problems.append("MIG enabled but no instances created")
    return problems


def _put(entry: dict[str, Any], key: str, value: Any) -> None:
    """Absent means unknown: only known values go into an entry."""
    if value is not None:
        entry[key] = value


def memory_health(card: CardFacts) -> dict[str, Any]:
    """The entry's ``ecc``, ``remapped_rows`` and ``retired_pages`` objects, each only with what is known."""
    out: dict[str, Any] = {}
    if card.ecc is not None:
        ecc: dict[str, Any] = {s: dict(getattr(card.ecc, s)) for s in ECC_SECTIONS if getattr(card.ecc, s)}
        _put(ecc, "sram_threshold_exceeded", card.ecc.sram_threshold_exceeded)
        out["ecc"] = ecc
    remap: dict[str, Any] = {}
    _put(remap, "correctable", card.remap_correctable)
    _put(remap, "uncorrectable", card.remap_uncorrectable)
    _put(remap, "pending", card.remap_pending)
    _put(remap, "failure", card.remap_failure)
    _put(remap, "bank_availability", card.remap_histogram)
    if remap:
        out["remapped_rows"] = remap
    retired: dict[str, Any] = {}
    _put(retired, "single_bit", card.retired_sbe)
    _put(retired, "double_bit", card.retired_dbe)
    _put(retired, "pending", card.retired_pending)
    if retired:
        out["retired_pages"] = retired
    return out


def _card_entry(card: CardFacts) -> dict[str, Any]:
    entry: dict[str, Any] = {"index": card.index, "label": str(card.index)}
    _put(entry, "uuid", card.uuid)
    _put(entry, "name", card.name)
    _put(entry, "class", gpu_class(card.name, card.memory_mib))
    _put(entry, "memory_mb", card.memory_mib)
    _put(entry, "pci_bus", card.pci_bus)
    _put(entry, "numa", card.numa)
    _put(entry, "nvlink_peers", card.nvlink_peers)
    _put(entry, "nics", card.nics)
    entry["health"] = health(card)
    entry.update(memory_health(card))
    if card.fabric is not None:
        entry["fabric"] = fabric_report(card.fabric)
    _put(entry, "mig_mode", card.mig_mode)
    _put(entry, "temperature_c", card.temperature_c)
    _put(entry, "power_w", card.power_w)
    _put(entry, "utilization_pct", card.utilization_pct)
    _put(entry, "processes", card.processes)
    return entry


def _mig_entry(card: CardFacts, mig: MigFacts, profile: str | None, card_health: list[str]) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "index": MIG_BASE + 100 * card.index + mig.device,
        "label": f"{card.index}/mig{mig.device}",
        "parent": card.index,
    }
    _put(entry, "parent_uuid", card.uuid)
    _put(entry, "uuid", mig.mig_uuid)
    _put(entry, "mig_uuid", mig.mig_uuid)
    _put(entry, "name", card.name)
    _put(entry, "mig_profile", profile)
    card_class = gpu_class(card.name, card.memory_mib)
    if card_class is not None and profile is not None:
        entry["class"] = f"{card_class}-mig-{profile}"
    _put(entry, "memory_mb", mig.memory_mib)
    _put(entry, "pci_bus", card.pci_bus)
    _put(entry, "numa", card.numa)
    entry["nvlink_peers"] = []  # MIG instances have no NVLink peer-to-peer
    _put(entry, "nics", card.nics)
    own = list(card_health)
    if mig.ecc_uncorrectable:
        own.append(f"{mig.ecc_uncorrectable} uncorrectable ECC errors in this instance since the last reset")
    entry["health"] = own
    entry.update(memory_health(card))  # the card's memory: an instance has no counters of its own
    _put(entry, "mig_mode", card.mig_mode)
    _put(entry, "gpu_instance_id", mig.gpu_instance_id)
    _put(entry, "compute_instance_id", mig.compute_instance_id)
    _put(entry, "processes", mig.processes)
    return entry


def entries(cards: list[CardFacts]) -> tuple[list[dict[str, Any]], list[str]]:
    """Report entries for the cards (MIG cards as their instances), and the problems found on the way."""
    out: list[dict[str, Any]] = []
    problems: list[str] = []
    for card in sorted(cards, key=lambda c: c.index):
        if not card.migs:
            out.append(_card_entry(card))
            continue
        card_health = health(card)
        for mig in card.migs:
            profile = mig.profile or derive_mig_profile(card.name, card.memory_mib, mig)
            if profile is None:
                problems.append(
                    f"gpu {card.index}/mig{mig.device}: MIG profile unknown (the source does not name it and its "
                    "SM and memory counts match no known profile; give nvidia-smi -L)"
                )
            out.append(_mig_entry(card, mig, profile, card_health))
    return out, problems
