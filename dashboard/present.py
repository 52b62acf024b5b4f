"""Shaping the shared read functions' data for the pages: grids, groups and words. Pure, no Django."""

from __future__ import annotations

from typing import Any

NVLINK, SELF, NONE, UNKNOWN = "nv", "self", "none", "unknown"


def nvlink_matrix(gpus: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Who reaches whom over NVLink, card by card, as ``nvidia-smi topo -m`` draws it; None under two cards.

    A card whose peers were not reported has a row of ``unknown``: a node
    whose agent could not read the topology is not a node without NVLink.
    """
    cards = [g for g in gpus if "parent" not in g]
    if len(cards) < 2:
        return None
    rows = []
    for g in cards:
        peers = g.get("nvlink_peers")
        cells = []
        for h in cards:
            if h is g:
                cells.append((SELF, "X"))
            elif peers is None:
                cells.append((UNKNOWN, "?"))
            elif h["index"] in peers:
                cells.append((NVLINK, "NV"))
            else:
                cells.append((NONE, "–"))
        rows.append({"gpu": g, "cells": cells})
    linked = [c for r in rows for c in r["cells"] if c[0] == NVLINK]
    pairs = len(cards) * (len(cards) - 1)
    return {"cards": cards, "rows": rows, "all_to_all": len(linked) == pairs, "linked_pairs": len(linked) // 2}


def mig_cards(gpus: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The cards in MIG mode with their instances (``card/migN``, class, memory), cards in index order."""
    cards: dict[int, dict[str, Any]] = {}
    for g in gpus:
        if "parent" in g:
            cards.setdefault(g["parent"], {"card": g["parent"], "instances": []})["instances"].append(g)
        elif (g.get("mig_mode") or "").lower() in ("enabled", "enable", "on", "true"):
            cards.setdefault(g["index"], {"card": g["index"], "instances": []})["gpu"] = g
    return [cards[k] for k in sorted(cards)]


def human_bytes(n: int | float | None) -> str:
    if n is None:
        return "unknown"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def human_seconds(s: int | float | None) -> str:
    """12 s, 4 min, 3 h, 2 d: the precision a person reads a last-seen or an idle time at."""
    if s is None or s < 0:
        return "never"
    s = int(s)
    if s < 90:
        return f"{s} s"
    if s < 90 * 60:
        return f"{s // 60} min"
    if s < 36 * 3600:
        return f"{s // 3600} h"
    return f"{s // 86400} d"
