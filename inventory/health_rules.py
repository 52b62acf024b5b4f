"""How bad a card's health problem is: a severity for each, from what NVIDIA documents.

Pure: facts in, severities out; no Django, no I/O. The control plane decides what a problem
means (the agent only reports facts and words); whoever acts on health (draining a replica,
cordoning a node) asks this module, and only this module, how grave a problem is.

Sources (NVIDIA's documentation, read 2026):

* Xid errors: "Analyzing Xid Errors with the Xid Catalog",
  https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html — for Ampere and newer,
  each Xid's *Resolution Bucket (Immediate Action)*: IGNORE, RESTART_APP, RESET_GPU, RESTART_BM
  (bare metal), RESTART_VM, WORKFLOW_XID_48, WORKFLOW_NVLINK_ERR, CHECK_MECHANICALS, UPDATE_SWFW,
  CHECK_UVM, CONTACT_SUPPORT, XID_154. :data:`XID_BUCKETS` copies that column for the codes the
  catalogue lists as used; :data:`BUCKET_SEVERITY` turns a bucket into a severity.
* Memory: "NVIDIA GPU Memory Error Management",
  https://docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/ — a *pending* row remap needs a GPU
  reset but "unaffected applications can continue running"; the row-remapping *failure* flag and
  the SRAM *threshold exceeded* flag are the RMA criteria; page retirement (pre-Ampere) "supported
  a maximum of 64 retirements".
* Fabric: ``nvmlGpuFabricInfo_v3_t`` in nvml.h — the health summary is Healthy, Unhealthy or
  Limited Capacity; the health-mask bits say why. NVIDIA gives the bits no severity: a bit that
  leaves the card without a working fabric (route unhealthy, wrong configuration, no partition,
  registration failed) is read as FATAL, one that leaves it working but slower or recovering as
  WARNING — llmgw's reading, stated here so it can be argued with.

Deviations from the catalogue's immediate-action column, each from the catalogue's own text:

* Xid 43 (IGNORE): "a user application error ... The GPU remains in a healthy state" → APPLICATION.
* Xid 45 (WORKFLOW_XID_45): the driver tearing an application down, "follow other Xid" → APPLICATION.
* Xid 92 (IGNORE): a high single-bit ECC error rate is the card's memory degrading → WARNING.
* Xid 94 (RESTART_APP): a *contained* memory error; "reset the GPU when convenient" → WARNING.
* Xid 154 (XID_154): its message names the recovery action the driver now wants ("GPU Reset
  Required", "Node Reboot Required", "Drain and Reset", "Drain P2P", "None"), which decides.

An Xid the catalogue does not list (a newer driver's) gets :data:`DEFAULT_XID_SEVERITY`, WARNING:
counted against the card and the node (so repeats cordon), but not enough alone to drain.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import IntEnum, StrEnum
from typing import Any


class Severity(IntEnum):
    """Ordered: a larger one is graver. FATAL and above mean the card cannot serve as it is."""

    INFO = 0  # a fact; nothing to do (the catalogue's IGNORE; a settled counter)
    APPLICATION = 1  # the application's fault, not the card's (RESTART_APP)
    WARNING = 2  # the card works; reset or look when convenient; repeats matter
    FATAL = 3  # the card cannot serve until reset or reboot (RESET_GPU, RESTART_BM, ...)
    SERVICE = 4  # the hardware needs service (NVIDIA's RMA criteria, CHECK_MECHANICALS)


def is_fatal(severity: Severity) -> bool:
    """Whether a problem of this severity takes the card out of service (a replica on it must move)."""
    return severity >= Severity.FATAL


class Kind(StrEnum):
    """Every health problem llmgw knows of. An Xid carries its code in :class:`Problem`."""

    XID = "xid"
    GPU_LOST = "gpu lost"
    ECC_VOLATILE_UNCORRECTABLE = "uncorrectable ECC errors since the last reset"
    ECC_AGGREGATE_UNCORRECTABLE = "uncorrectable ECC errors in the card's life"
    ECC_RISING = "ECC error counter rising"
    ROW_REMAPS_RISING = "remapped rows rising"
    RETIRED_PAGES_RISING = "retired pages rising"
    SRAM_THRESHOLD_EXCEEDED = "SRAM uncorrectable errors over NVIDIA's threshold"
    ROW_REMAP_PENDING = "row remapping pending"
    ROW_REMAP_FAILURE = "row remapping failed"
    ROW_REMAP_BANKS_EXHAUSTED = "memory banks without spare rows"
    RETIRED_PAGES_PENDING = "retired pages pending"
    RETIRED_PAGES_AT_LIMIT = "retired pages at NVIDIA's limit"
    FABRIC_NOT_REGISTERED = "fabric registration not completed"
    FABRIC_REGISTRATION_FAILED = "fabric registration failed"
    FABRIC_UNHEALTHY = "fabric health unhealthy"
    FABRIC_LIMITED_CAPACITY = "fabric health limited capacity"
    FABRIC_DEGRADED_BANDWIDTH = "fabric bandwidth degraded"
    FABRIC_ROUTE_RECOVERY = "fabric route recovery in progress"
    FABRIC_ROUTE_UNHEALTHY = "fabric route unhealthy"
    FABRIC_ACCESS_TIMEOUT_RECOVERY = "fabric access timeout recovery"
    FABRIC_INCORRECT_CONFIGURATION = "fabric configuration incorrect"
    FABRIC_NO_PARTITION = "no fabric partition assigned"
    FABRIC_MANAGER_DISCONNECTED = "fabric manager disconnected"
    NVLINK_ERRORS_RISING = "NVLink error counters rising"
    IB_ERRORS_RISING = "InfiniBand error counters rising"


@dataclass(frozen=True)
class Problem:
    """One health problem of one card; ``code`` is the Xid number (None for other kinds)."""

    kind: Kind
    code: int | None = None
    message: str = ""


# Every kind but XID, with the reason for its severity in the module docstring's sources.
KIND_SEVERITY: dict[Kind, Severity] = {
    Kind.GPU_LOST: Severity.FATAL,  # Xid 79's state: the driver cannot reach the card (RESTART_BM)
    Kind.ECC_VOLATILE_UNCORRECTABLE: Severity.FATAL,  # Xid 48: "a GPU reset or node reboot is needed"
    Kind.ECC_AGGREGATE_UNCORRECTABLE: Severity.INFO,  # the card's history; volatile says if it is now
    Kind.ECC_RISING: Severity.WARNING,  # memory wearing: watch it (a new uncorrectable one is also volatile)
    Kind.ROW_REMAPS_RISING: Severity.WARNING,  # spare rows being used up
    Kind.RETIRED_PAGES_RISING: Severity.WARNING,  # toward the limit of 64
    Kind.SRAM_THRESHOLD_EXCEEDED: Severity.SERVICE,  # RMA criterion ("run field diag")
    Kind.ROW_REMAP_PENDING: Severity.WARNING,  # reset needed; unaffected applications continue
    Kind.ROW_REMAP_FAILURE: Severity.SERVICE,  # RMA criterion
    Kind.ROW_REMAP_BANKS_EXHAUSTED: Severity.WARNING,  # the next uncorrectable error there fails to remap
    Kind.RETIRED_PAGES_PENDING: Severity.WARNING,  # retirement takes effect at the next reset
    Kind.RETIRED_PAGES_AT_LIMIT: Severity.SERVICE,  # no further page can be retired
    Kind.FABRIC_NOT_REGISTERED: Severity.FATAL,
    Kind.FABRIC_REGISTRATION_FAILED: Severity.FATAL,
    Kind.FABRIC_UNHEALTHY: Severity.FATAL,
    Kind.FABRIC_LIMITED_CAPACITY: Severity.WARNING,
    Kind.FABRIC_DEGRADED_BANDWIDTH: Severity.WARNING,
    Kind.FABRIC_ROUTE_RECOVERY: Severity.WARNING,
    Kind.FABRIC_ROUTE_UNHEALTHY: Severity.FATAL,
    Kind.FABRIC_ACCESS_TIMEOUT_RECOVERY: Severity.WARNING,
    Kind.FABRIC_INCORRECT_CONFIGURATION: Severity.FATAL,
    Kind.FABRIC_NO_PARTITION: Severity.FATAL,
    Kind.FABRIC_MANAGER_DISCONNECTED: Severity.WARNING,  # running traffic continues; no recovery
    Kind.NVLINK_ERRORS_RISING: Severity.WARNING,
    Kind.IB_ERRORS_RISING: Severity.WARNING,
}

BUCKET_SEVERITY: dict[str, Severity] = {
    "IGNORE": Severity.INFO,
    "RESTART_APP": Severity.APPLICATION,
    "RESET_GPU": Severity.FATAL,
    "RESTART_BM": Severity.FATAL,
    "RESTART_VM": Severity.FATAL,
    "WORKFLOW_XID_48": Severity.FATAL,  # double-bit ECC: "a GPU reset or node reboot is needed"
    "WORKFLOW_NVLINK_ERR": Severity.FATAL,  # Xid 74: "a GPU reset or node reboot is needed"
    "WORKFLOW_NVLINK5_ERR": Severity.FATAL,
    "CHECK_MECHANICALS": Severity.SERVICE,
    "UPDATE_SWFW": Severity.WARNING,
    "CHECK_UVM": Severity.WARNING,
    "CONTACT_SUPPORT": Severity.WARNING,
}
DEFAULT_XID_SEVERITY = Severity.WARNING


def _codes(first: int, last: int, bucket: str) -> dict[int, str]:
    return dict.fromkeys(range(first, last + 1), bucket)


# The catalogue's "Resolution Bucket (Immediate Action)" for every Xid it marks as applying to a
# data-centre GPU (A100, H100, B100 or GB200). Codes it marks unused are left out: they get the default.
XID_BUCKETS: dict[int, str] = {
    8: "RESTART_APP",
    11: "RESTART_APP",
    13: "RESTART_APP",
    14: "IGNORE",
    25: "RESTART_APP",
    31: "RESTART_APP",
    32: "RESTART_APP",
    37: "IGNORE",
    38: "IGNORE",
    39: "RESTART_APP",
    40: "RESTART_APP",
    41: "RESTART_APP",
    43: "IGNORE",
    44: "IGNORE",
    45: "WORKFLOW_XID_45",
    46: "RESET_GPU",
    48: "WORKFLOW_XID_48",
    54: "CHECK_MECHANICALS",
    60: "RESTART_APP",
    62: "RESET_GPU",
    63: "IGNORE",
    64: "RESET_GPU",
    66: "IGNORE",
    67: "IGNORE",
    68: "RESTART_APP",
    69: "RESTART_APP",
    **_codes(70, 72, "RESTART_APP"),
    74: "WORKFLOW_NVLINK_ERR",
    **_codes(75, 77, "RESTART_APP"),
    78: "UPDATE_SWFW",
    79: "RESTART_BM",
    80: "RESTART_APP",
    **_codes(82, 86, "RESTART_APP"),
    88: "RESTART_APP",
    89: "RESTART_APP",
    92: "IGNORE",
    93: "IGNORE",
    94: "RESTART_APP",
    95: "RESET_GPU",
    **_codes(96, 105, "RESTART_APP"),
    106: "IGNORE",
    107: "IGNORE",
    108: "IGNORE",
    109: "RESET_GPU",
    110: "RESET_GPU",
    119: "RESET_GPU",
    120: "RESET_GPU",
    121: "IGNORE",
    **_codes(126, 135, "RESTART_APP"),
    136: "RESET_GPU",
    137: "IGNORE",
    139: "RESTART_APP",
    140: "RESET_GPU",
    141: "IGNORE",
    142: "CONTACT_SUPPORT",
    143: "RESET_GPU",
    **_codes(144, 150, "WORKFLOW_NVLINK5_ERR"),
    151: "RESTART_VM",
    152: "IGNORE",
    153: "IGNORE",
    154: "XID_154",
    155: "RESET_GPU",
    156: "RESET_GPU",
    157: "IGNORE",
    158: "RESET_GPU",
    159: "CHECK_UVM",
    160: "IGNORE",
    161: "IGNORE",
}

# The catalogue's own text overrules its immediate-action column (see the module docstring).
XID_OVERRIDES: dict[int, Severity] = {
    43: Severity.APPLICATION,
    45: Severity.APPLICATION,
    92: Severity.WARNING,
    94: Severity.WARNING,
}

# Xid 154's message: "GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)".
_RECOVERY_ACTIONS = {
    "none": Severity.INFO,
    "drain p2p": Severity.WARNING,
    "drain and reset": Severity.FATAL,
    "gpu reset required": Severity.FATAL,
    "node reboot required": Severity.FATAL,
}
_TO_ACTION = re.compile(r"to\s+0x[0-9a-fA-F]+\s*\(([^)]*)\)")


def xid_severity(code: int, message: str = "") -> Severity:
    """The severity of one Xid; unknown codes get DEFAULT_XID_SEVERITY."""
    if code in XID_OVERRIDES:
        return XID_OVERRIDES[code]
    bucket = XID_BUCKETS.get(code)
    if bucket == "XID_154":
        found = _TO_ACTION.search(message or "")
        return _RECOVERY_ACTIONS.get(found.group(1).strip().lower(), Severity.INFO) if found else Severity.INFO
    if bucket is None:
        return DEFAULT_XID_SEVERITY
    return BUCKET_SEVERITY[bucket]


def severity(problem: Problem) -> Severity:
    """The one severity of a problem."""
    if problem.kind is Kind.XID:
        return DEFAULT_XID_SEVERITY if problem.code is None else xid_severity(problem.code, problem.message)
    return KIND_SEVERITY[problem.kind]


def worst(problems: list[Problem]) -> Severity | None:
    """The gravest severity among problems; None when there are none."""
    return max((severity(p) for p in problems), default=None)


# ---------------------------------------------------------------------------
# problems from a card's facts (a report entry, or a GPU row's columns in the same shape)

_XID_WORDS = re.compile(r"^Xid (\d+)\b(?:.*?last: (.*))?$")
_VOLATILE_WORDS = re.compile(r"^\d+ uncorrectable ECC errors .*since the last reset$")
_LIMIT_WORDS = re.compile(r"^\d+ retired pages .*limit")
# agent.discovery.gpus' health and fabric words → kind (the agent names, the control plane judges);
# the words also cover an older agent that sends no counters, and a MIG instance's own ECC count.
_WORDS = (
    ("row remapping failed", Kind.ROW_REMAP_FAILURE),
    ("row remapping pending", Kind.ROW_REMAP_PENDING),
    ("retired pages pending", Kind.RETIRED_PAGES_PENDING),
    ("sram uncorrectable errors over", Kind.SRAM_THRESHOLD_EXCEEDED),
    ("fabric registration failed", Kind.FABRIC_REGISTRATION_FAILED),
    ("fabric registration", Kind.FABRIC_NOT_REGISTERED),
    ("fabric health: limited capacity", Kind.FABRIC_LIMITED_CAPACITY),
    ("fabric health:", Kind.FABRIC_UNHEALTHY),
    ("fabric bandwidth degraded", Kind.FABRIC_DEGRADED_BANDWIDTH),
    ("fabric route recovery", Kind.FABRIC_ROUTE_RECOVERY),
    ("fabric route unhealthy", Kind.FABRIC_ROUTE_UNHEALTHY),
    ("fabric access timeout recovery", Kind.FABRIC_ACCESS_TIMEOUT_RECOVERY),
    ("fabric configuration incorrect", Kind.FABRIC_INCORRECT_CONFIGURATION),
    ("no fabric partition", Kind.FABRIC_NO_PARTITION),
    ("fabric manager disconnected", Kind.FABRIC_MANAGER_DISCONNECTED),
)
RETIRED_PAGES_LIMIT = 64  # NVIDIA: "a maximum of 64 retirements for the frame buffer"


def _count(obj: Any, *path: str) -> int:
    for key in path:
        obj = obj.get(key) if isinstance(obj, Mapping) else None
    return obj if isinstance(obj, int) and not isinstance(obj, bool) and obj > 0 else 0


def _flag(obj: Any, key: str) -> bool:
    return isinstance(obj, Mapping) and obj.get(key) is True


def _memory_problems(card: Mapping[str, Any]) -> list[Problem]:
    ecc, remap, retired = card.get("ecc"), card.get("remapped_rows"), card.get("retired_pages")
    out: list[Problem] = []
    if _count(ecc, "volatile", "sram_uncorrectable") + _count(ecc, "volatile", "dram_uncorrectable"):
        out.append(Problem(Kind.ECC_VOLATILE_UNCORRECTABLE))
    if _count(ecc, "aggregate", "sram_uncorrectable") + _count(ecc, "aggregate", "dram_uncorrectable"):
        out.append(Problem(Kind.ECC_AGGREGATE_UNCORRECTABLE))
    if _flag(ecc, "sram_threshold_exceeded"):
        out.append(Problem(Kind.SRAM_THRESHOLD_EXCEEDED))
    if _flag(remap, "pending"):
        out.append(Problem(Kind.ROW_REMAP_PENDING))
    if _flag(remap, "failure"):
        out.append(Problem(Kind.ROW_REMAP_FAILURE))
    if _count(remap, "bank_availability", "none"):
        out.append(Problem(Kind.ROW_REMAP_BANKS_EXHAUSTED))
    if _flag(retired, "pending"):
        out.append(Problem(Kind.RETIRED_PAGES_PENDING))
    if _count(retired, "single_bit") + _count(retired, "double_bit") >= RETIRED_PAGES_LIMIT:
        out.append(Problem(Kind.RETIRED_PAGES_AT_LIMIT))
    return out


def _word_problems(card: Mapping[str, Any]) -> list[Problem]:
    health = card.get("health")
    fabric = card.get("fabric")
    words = [w for w in (health if isinstance(health, list) else []) if isinstance(w, str)]
    fabric_words = fabric.get("problems") if isinstance(fabric, Mapping) else None
    words += [w for w in (fabric_words if isinstance(fabric_words, list) else []) if isinstance(w, str)]
    out: list[Problem] = []
    for word in words:
        m = _XID_WORDS.match(word)
        if m:
            out.append(Problem(Kind.XID, int(m.group(1)), m.group(2) or ""))
        elif word == "GPU is lost":
            out.append(Problem(Kind.GPU_LOST))
        elif _VOLATILE_WORDS.match(word):
            out.append(Problem(Kind.ECC_VOLATILE_UNCORRECTABLE))
        elif _LIMIT_WORDS.match(word):
            out.append(Problem(Kind.RETIRED_PAGES_AT_LIMIT))
        else:
            low = word.lower()
            kind = next((k for prefix, k in _WORDS if low.startswith(prefix)), None)
            if kind is not None:
                out.append(Problem(kind))
    return out


def card_problems(card: Mapping[str, Any]) -> list[Problem]:
    """The problems a card's facts show, each once, in a stable order.

    ``card`` is a report's GPU entry (or a GPU row's columns in that shape): ``health`` words
    for Xids and a lost card, ``fabric.problems`` for the fabric, and the memory counters
    (``ecc``, ``remapped_rows``, ``retired_pages``) for the rest. A settled counter — rows
    remapped with nothing pending, pages retired under the limit — is no problem at all; past
    uncorrectable ECC errors (aggregate) are one of severity INFO, a fact worth listing.
    """
    seen: dict[Problem, None] = {}
    for problem in [*_word_problems(card), *_memory_problems(card)]:
        seen.setdefault(problem, None)
    return list(seen)


# ---------------------------------------------------------------------------
# counters that rose: a finding, where a settled counter is none

# How long after a card's counters last changed a rise is still reported: long enough that a
# sweep sees a one-off rise and the operator reads it, short enough that a settled counter
# stops being news. Counters that keep rising keep it open (each change restarts the day).
RISING_WINDOW_S = 24 * 3600

# The life-long counters (volatile ECC counts restart at each reset, so they cannot be compared).
_RISING = (
    (
        Kind.ECC_RISING,
        "ecc",
        ("aggregate",),
        ("sram_correctable", "sram_uncorrectable", "dram_correctable", "dram_uncorrectable"),
    ),
    (Kind.ROW_REMAPS_RISING, "remapped_rows", (), ("correctable", "uncorrectable")),
    (Kind.RETIRED_PAGES_RISING, "retired_pages", (), ("single_bit", "double_bit")),
)


def _at(obj: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        obj = obj.get(key) if isinstance(obj, Mapping) else None
    return obj


def _number(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def rising(card: Mapping[str, Any], before: Mapping[str, Any] | None) -> list[Problem]:
    """The counters of ``card`` that are higher than in ``before`` (same shapes), one problem per kind.

    Each problem's message says which counters rose and from what ("aggregate dram_correctable
    0 → 1"). A counter unknown on either side, or lower now (another card, a counter reset), is
    no rise.
    """
    if not isinstance(before, Mapping):
        return []
    out: list[Problem] = []
    for kind, column, section, counters in _RISING:
        now_block, old_block = _at(card.get(column), section), _at(before.get(column), section)
        rose = []
        for name in counters:
            new, old = _number(_at(now_block, (name,))), _number(_at(old_block, (name,)))
            if new is not None and old is not None and new > old:
                rose.append(f"{' '.join((*section, name))} {old} → {new}")
        if rose:
            out.append(Problem(kind, message=", ".join(rose)))
    return out
