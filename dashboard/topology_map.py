"""A fabric's map laid out for drawing.

Data: ``inventory.reads.topology(fabric)["map"]``, the last scan of the
fabric parsed and turned into leaves, spines, hosts and links by
``inventory.topology.build_view`` with the cluster's adapters marked — the
same function the API serves. Renderer: ``TopologyRenderer`` puts spines in
a row on top, leaves in a row below them, and each leaf's hosts in a column
under it; switch-to-switch cables are drawn once per pair of switches (a
spine and a leaf are joined by many cables, which at 1,000 links would be a
grey smear). Template: ``dashboard/topology.svg``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Geometry, in SVG user units.
COL_W = 26
HOST_H = 7
HOST_GAP = 2
SWITCH_H = 16
SPINE_Y = 40
LEAF_Y = 150
HOSTS_Y = LEAF_Y + SWITCH_H + 12
MARGIN = 20


@dataclass
class Box:
    guid: str
    label: str
    x: float
    y: float
    w: float
    h: float
    state: str
    title: str
    node: str = ""  # ours: the node's name
    hca: str = ""


@dataclass
class Line:
    x1: float
    y1: float
    x2: float
    y2: float
    state: str  # "up" or "degraded"
    cables: int


@dataclass
class Drawing:
    width: float
    height: float
    spines: list[Box]
    leaves: list[Box]
    hosts: list[Box]
    links: list[Line]
    others: list[Box] = field(default_factory=list)


def port_state(live: dict[str, Any] | None) -> str:
    """An adapter of ours by its last report: ``active``, ``errors`` (active, error counters non-zero), ``down``."""
    if live is None:
        return "unreported"
    if "ACTIVE" not in str(live.get("state") or "").upper():
        return "down"
    return "errors" if live.get("errors") else "active"


class TopologyRenderer:
    """Lays out a ``build_view`` map; ``live`` is the cluster's own ports by (node, hca) from their reports."""

    def __init__(self, view: dict[str, Any], live: dict[tuple[str, str], dict[str, Any]]) -> None:
        self.view = view
        self.live = live

    def render(self) -> Drawing:
        leaves = [s for s in self.view["switches"] if s["role"] == "leaf"]
        spines = [s for s in self.view["switches"] if s["role"] != "leaf"]
        cols = max(len(leaves), 1)
        width = MARGIN * 2 + cols * COL_W
        leaf_boxes = {s["guid"]: self._switch(s, MARGIN + i * COL_W, LEAF_Y) for i, s in enumerate(leaves)}
        step = (width - 2 * MARGIN) / max(len(spines), 1)
        spine_boxes = {
            s["guid"]: self._switch(s, MARGIN + i * step + (step - COL_W) / 2, SPINE_Y) for i, s in enumerate(spines)
        }
        hosts, deepest = self._hosts(leaf_boxes)
        return Drawing(
            width=width,
            height=HOSTS_Y + deepest * (HOST_H + HOST_GAP) + MARGIN,
            spines=list(spine_boxes.values()),
            leaves=list(leaf_boxes.values()),
            hosts=hosts,
            links=self._switch_links({**spine_boxes, **leaf_boxes}),
        )

    def _switch(self, s: dict[str, Any], x: float, y: float) -> Box:
        title = f"{s['label']} ({s['role']}, {s['guid']}): {len(s['hosts'])} hosts, {s['switch_links']} switch cables"
        return Box(s["guid"], s["label"], round(x + 2, 1), y, COL_W - 4, SWITCH_H, s["role"], title)

    def _hosts(self, leaves: dict[str, Box]) -> tuple[list[Box], int]:
        depth: dict[str, int] = {}
        out = []
        for a in self.view["hosts"]:
            if a["kind"] != "host" or a["leaf"] not in leaves:
                continue
            leaf = leaves[a["leaf"]]
            row = depth.get(a["leaf"], 0)
            depth[a["leaf"]] = row + 1
            ours = a["node"] is not None
            state = port_state(self.live.get((a["node"], a["hca"]))) if ours else "theirs"
            who = f"{a['node']} {a['hca']}" if ours else (a["description"] or a["guid"])
            out.append(
                Box(
                    a["guid"],
                    who,
                    leaf.x,
                    HOSTS_Y + row * (HOST_H + HOST_GAP),
                    leaf.w,
                    HOST_H,
                    state,
                    f"{who} ({a['guid']}) on {leaf.label} port {a['leaf_port']}: {state}",
                    node=a["node"] or "",
                    hca=a["hca"] or "",
                )
            )
        return out, max(depth.values(), default=0)

    def _switch_links(self, boxes: dict[str, Box]) -> list[Line]:
        """One line per pair of switches cabled together, degraded when any of its cables is."""
        pairs: dict[tuple[str, str], list[str]] = {}
        for link in self.view["links"]:
            if link["tier"] != "fabric" or link["a"] not in boxes or link["b"] not in boxes:
                continue
            pairs.setdefault(tuple(sorted((link["a"], link["b"]))), []).append(link["state"])
        lines = []
        for (a, b), states in sorted(pairs.items()):
            top, bottom = sorted((boxes[a], boxes[b]), key=lambda box: box.y)
            lines.append(
                Line(
                    top.x + top.w / 2,
                    top.y + top.h,
                    bottom.x + bottom.w / 2,
                    bottom.y,
                    "degraded" if "degraded" in states else "up",
                    len(states),
                )
            )
        # Degraded last, so they are drawn over the healthy ones and seen.
        return sorted(lines, key=lambda line: line.state == "degraded")
