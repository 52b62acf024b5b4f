"""Numbering and counting a node's devices by class, and reading a card's nearest adapter.

Pure code over plain dicts (GPU rows as ``.values()`` gives them), so the node
list, the node page and the fleet summary count the same way and never query
per GPU. No Django: the models import their MIG numbering from here.

A device is what placement hands out: a whole card, or one MIG instance. A
card in MIG mode that has instances is not a device itself (it is placed only
through its instances); one with no instances is a device held back with the
reason, so the fleet does not look smaller than it is.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

# MIG instances are GPU rows numbered past every real card index, so a card
# and its instances sort together and never collide: 1000 + 100 × card + gi.
MIG_INDEX_BASE = 1000
MIG_INDEX_STRIDE = 100


def mig_index(card: int, instance: int) -> int:
    """The inventory number of MIG instance ``instance`` on card ``card``."""
    return MIG_INDEX_BASE + MIG_INDEX_STRIDE * card + instance


def mig_label(index: int) -> str:
    """How people see a GPU number: ``3`` for a card, ``3/mig2`` for an instance."""
    if index < MIG_INDEX_BASE:
        return str(index)
    card, instance = divmod(index - MIG_INDEX_BASE, MIG_INDEX_STRIDE)
    return f"{card}/mig{instance}"


# Nearness of an adapter to a card, as nvidia-smi topo prints it, nearest first.
GPU_NUMBER_LIMIT = 10**10
"""A holder's entry at or past this names no GPU: ten digits, past any GPU number (inventory.reads.gpu_counts'
SQL reads the same, so its cast cannot overflow)."""


def held_indices(entries: Any) -> list[int]:
    """The GPUs a holder names (a shard's ``gpu_indices``): its whole numbers from 0 up, in its order.

    The one reading of it, for the counts, the node list and placement's
    snapshot alike. Anything else holds nothing: JSON true is no GPU 1, "3"
    no GPU 3, 2.0 no GPU 2, and a value that is not a list no GPU at all.
    """
    if not isinstance(entries, list):
        return []
    return [i for i in entries if type(i) is int and 0 <= i < GPU_NUMBER_LIMIT]


NEARNESS = ("PIX", "PXB", "PHB", "NODE", "SYS")

HELD_MIG_EMPTY = "in MIG mode with no instances"
HELD_NO_MIG_UUID = "a MIG instance without its MIG UUID"


def devices(gpus: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The rows placement can hand out: cards not carved into MIG instances, and the instances."""
    rows = list(gpus)
    carved = {g["parent_index"] for g in rows if g["parent_index"] is not None}
    return [g for g in rows if g["parent_index"] is not None or g["index"] not in carved]


def held_reason(gpu: Mapping[str, Any]) -> str | None:
    """Why a healthy device is out of placement, or None."""
    if gpu["parent_index"] is None and gpu["index"] < MIG_INDEX_BASE and mig_enabled(gpu.get("mig_mode")):
        return HELD_MIG_EMPTY
    if gpu["parent_index"] is not None and not gpu.get("mig_uuid"):
        return HELD_NO_MIG_UUID
    return None


MIG_ON_WORDS = ("enabled", "enable", "on", "true")
"""The words a card's current MIG mode is on in, as drivers and the agent spell it (any case)."""


def mig_enabled(mode: str | None) -> bool:
    """Whether a card is in MIG mode now: the one rule, for the counts, the scheduler and the SQL that counts.

    A mode is its current word and, when a change waits for a GPU reset, what
    is pending: ``enabled (pending disable)`` is in MIG mode until the reset
    (its whole card cannot be handed out), ``disabled (pending enable)`` is
    not. So the rule reads the leading ASCII letters of the mode, with
    whatever Python strips around it stripped, in any case. The migration
    that counts devices in PostgreSQL (inventory 0015) reads it the same way;
    tests/inventory/test_device_counts.py holds the two equal for any text.
    """
    word = _LEADING_WORD.match((mode or "").strip())
    return word is not None and word.group().lower() in MIG_ON_WORDS


_LEADING_WORD = re.compile(r"[A-Za-z]*")


def count_by_class(gpus: Iterable[Mapping[str, Any]], used: set[int]) -> list[dict[str, Any]]:
    """Per class: total, used, free, unhealthy and held back (out of placement for another reason).

    Unhealthy wins over used: a card that failed under a replica is not
    capacity whoever holds it, and counting it as used would hide the fault.
    """
    out: dict[str, dict[str, Any]] = {}
    for g in devices(gpus):
        c = out.setdefault(g["gpu_class"], {"class": g["gpu_class"], "total": 0, "used": 0, "unhealthy": 0, "held": 0})
        c["total"] += 1
        if g["health"]:
            c["unhealthy"] += 1
        elif held_reason(g):
            c["held"] += 1
        elif g["index"] in used:
            c["used"] += 1
    for c in out.values():
        c["free"] = c["total"] - c["used"] - c["unhealthy"] - c["held"]
    return [out[k] for k in sorted(out)]


def out_of_placement(gpus: Iterable[Mapping[str, Any]]) -> list[str]:
    """One line per device kept out of placement, with why: "gpu 3: Xid 79", "gpu 0: in MIG mode with no instances"."""
    lines = []
    for g in devices(gpus):
        if g["health"]:
            lines.append(f"gpu {mig_label(g['index'])}: {g['health'][0]}")
        elif why := held_reason(g):
            lines.append(f"gpu {mig_label(g['index'])}: {why}")
    return lines


def nearest_nic(nics: Mapping[str, str] | None) -> tuple[str, str] | None:
    """The adapter closest to a card and how close (``("mlx5_0", "PIX")``); None when none was reported.

    Ties go to the adapter whose name sorts first, so the answer is stable.
    """
    if not nics:
        return None
    rank = {level: i for i, level in enumerate(NEARNESS)}
    hca = min(nics, key=lambda h: (rank.get(str(nics[h]).upper(), len(NEARNESS)), h))
    return hca, str(nics[hca])
