"""Drawing an NVLink domain as a rack: plain data in, shapes with coordinates out.

The split is NetBox's: the inventory knows the domain (``nvlink_report()``
gives it as plain data), this class decides where everything goes, and the
template ``dashboard/rack.svg`` only draws what it is handed. Nothing here
imports Django, so the geometry and the states are tested without a request.

A rack reads top to bottom: the NVLink Switch band, then one row per tray
(compute node) with its chips, and a backplane on the right that the light
runs down. A chip is ``joined`` (glows), ``down`` (pulses red: not in the
domain) or ``degraded`` (amber: joined, bandwidth reduced). Those three words
are also the ``data-state`` attribute that tests and scripts read.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any

JOINED, DOWN, DEGRADED = "joined", "down", "degraded"

# Geometry, in SVG user units. Sized so that a full NVL72 rack (18 trays × 4)
# is about 480 high: readable at a glance, and two racks side by side with
# their reasons still fit a laptop's width.
WIDTH = 300
PAD = 10
BAND_H = 34
TRAY_H = 20
TRAY_GAP = 3
LABEL_W = 38
BACKPLANE_W = 12
LINK_W = 10
CHIP_GAP = 6
CHIP_H = 12
SWITCHES = 9  # an NVL72 has nine NVLink Switch trays; drawn as nine blocks in the band

_GPU_REASON = re.compile(r"^gpu ([^\s:]+):? (.+)$")


@dataclass
class Chip:
    gpu: str  # "<node>/<label>": the data-gpu attribute
    label: str
    state: str
    x: float
    y: float
    w: float
    h: float
    healthy: bool = True
    title: str = ""

    @property
    def halo(self) -> tuple[float, float, float, float]:
        """The glow around a chip: a wider, translucent rect (an SVG filter on 720 chips would not stay smooth)."""
        return (self.x - 2, self.y - 2, self.w + 4, self.h + 4)


@dataclass
class Tray:
    node: str
    label: str
    y: float
    state: str  # "in", "out" or "unreachable"
    chips: list[Chip]
    imex: str  # "up", "down" or "unknown"
    title: str = ""
    x: float = PAD
    w: float = WIDTH - 2 * PAD - BACKPLANE_W - LINK_W
    h: float = TRAY_H

    @property
    def mid(self) -> float:
        return self.y + TRAY_H / 2

    @property
    def text_y(self) -> float:
        return self.mid + 3

    @property
    def label_x(self) -> float:
        return self.x + 6

    @property
    def imex_x(self) -> float:
        return self.x + self.w - 8

    @property
    def link(self) -> tuple[float, float]:
        """The cable from the tray to the backplane, x from and to."""
        return (self.x + self.w, self.x + self.w + LINK_W)


@dataclass
class Rack:
    key: str
    name: str
    width: float
    height: float
    band: tuple[float, float, float, float]
    switches: list[tuple[float, float, float, float]]
    backplane: tuple[float, float, float, float]
    trays: list[Tray]
    summary: dict[str, int]
    reasons: list[tuple[str, list[str]]] = field(default_factory=list)  # (node, lines), trays that are out
    warnings: list[tuple[str, list[str]]] = field(default_factory=list)  # (node, lines), joined but not right

    @property
    def light(self) -> tuple[float, float, float]:
        """The line the light runs down: x, top, bottom (the backplane's middle)."""
        x, y, w, h = self.backplane
        return (x + w / 2, y, y + h)

    @property
    def state(self) -> str:
        """The rack as one word: ``joined`` when every chip is, ``down`` when any is out, else ``degraded``."""
        if self.summary["down"]:
            return DOWN
        return DEGRADED if self.summary["degraded"] else JOINED


def chip_state(card: dict[str, Any]) -> str:
    if not card.get("joined"):
        return DOWN
    return DEGRADED if card.get("degraded") else JOINED


def short_names(names: list[str]) -> dict[str, str]:
    """Each tray's name less what every tray of the rack shares ("nvl72-00-tray-03" -> "03")."""
    if len(names) < 2:
        return {n: n for n in names}
    prefix = os.path.commonprefix(names)  # noqa: RUF071 - characters are wanted; cut at a separator below
    # Cut at a separator so "tray-1" and "tray-12" do not lose the shared "1".
    cut = max(prefix.rfind(sep) for sep in "-_./:") + 1
    return {n: (n[cut:] or n) for n in names}


def compress_reasons(lines: list[str]) -> list[str]:
    """Per-card lines that say the same thing become one: "gpus 0–3: fabric state In Progress".

    A tray that left its domain has all four cards out for one reason; four
    identical lines per tray would bury the one tray that is different.
    """
    groups: dict[str, list[str]] = {}
    out: list[str | tuple[str]] = []
    for line in lines:
        m = _GPU_REASON.match(line)
        if not m:
            out.append(line)
            continue
        label, rest = m.groups()
        if rest not in groups:
            groups[rest] = []
            out.append((rest,))
        groups[rest].append(label)
    return [item if isinstance(item, str) else _gpus_phrase(groups[item[0]]) + ": " + item[0] for item in out]


def _gpus_phrase(labels: list[str]) -> str:
    if len(labels) == 1:
        return f"gpu {labels[0]}"
    if all(lb.isdigit() for lb in labels):
        nums = sorted(int(lb) for lb in labels)
        if nums == list(range(nums[0], nums[-1] + 1)):
            return f"gpus {nums[0]}–{nums[-1]}"
    return "gpus " + ", ".join(labels)


class RackRenderer:
    """Lays out one domain of ``nvlink_report()["domains"]`` (or its ``unassigned`` nodes) as a Rack."""

    def __init__(self, domain: dict[str, Any]) -> None:
        self.domain = domain

    def render(self) -> Rack:
        nodes = self.domain.get("nodes", [])
        per_tray = max((len(n.get("cards", [])) for n in nodes), default=4) or 1
        labels = short_names([n["node"] for n in nodes])
        top = PAD + BAND_H + 12
        trays = [self._tray(n, labels[n["node"]], top + i * (TRAY_H + TRAY_GAP), per_tray) for i, n in enumerate(nodes)]
        bottom = top + max(1, len(nodes)) * (TRAY_H + TRAY_GAP) - TRAY_GAP
        chips = [c for t in trays for c in t.chips]
        summary = {
            "trays": len(trays),
            "trays_in": sum(1 for t in trays if t.state == "in"),
            "chips": len(chips),
            JOINED: sum(1 for c in chips if c.state == JOINED),
            DEGRADED: sum(1 for c in chips if c.state == DEGRADED),
            DOWN: sum(1 for c in chips if c.state == DOWN),
        }
        backplane_x = WIDTH - PAD - BACKPLANE_W
        return Rack(
            key=self.domain.get("key", ""),
            name=self._name(nodes),
            width=WIDTH,
            height=bottom + PAD,
            band=(PAD, PAD, WIDTH - 2 * PAD, BAND_H),
            switches=self._switches(),
            backplane=(backplane_x, PAD + BAND_H, BACKPLANE_W, bottom - PAD - BAND_H),
            trays=trays,
            summary=summary,
            reasons=[(n["node"], lines) for n in nodes if (lines := self._out(n))],
            warnings=[(n["node"], compress_reasons(n["warnings"])) for n in nodes if n.get("warnings")],
        )

    def _name(self, nodes: list[dict[str, Any]]) -> str:
        """The domain's name for people; unnamed, its first and last tray, which is how racks are labelled."""
        if self.domain.get("name"):
            return self.domain["name"]
        names = sorted(n["node"] for n in nodes)
        if len(names) > 1:
            return f"{names[0]} … {names[-1]}"
        return names[0] if names else self.domain.get("key") or "unassigned"

    @staticmethod
    def _out(node: dict[str, Any]) -> list[str]:
        """What keeps a tray out; a silent tray first, since its cards' states are as of its last report."""
        lines = compress_reasons(node.get("out") or [])
        if not node.get("reachable", True):
            lines.insert(0, "unreachable: no heartbeat from its agent, so what is drawn is its last report")
        return lines

    def _switches(self) -> list[tuple[float, float, float, float]]:
        inner = WIDTH - 2 * PAD - 16
        w = (inner - (SWITCHES - 1) * 4) / SWITCHES
        return [(PAD + 8 + i * (w + 4), PAD + 16, w, 12) for i in range(SWITCHES)]

    def _tray(self, node: dict[str, Any], label: str, y: float, per_tray: int) -> Tray:
        x0 = PAD + LABEL_W
        x1 = WIDTH - PAD - BACKPLANE_W - LINK_W - 18  # room for the IMEX light
        w = (x1 - x0 - (per_tray - 1) * CHIP_GAP) / per_tray
        chips = [
            Chip(
                gpu=f"{node['node']}/{card['label']}",
                label=card["label"],
                state=chip_state(card),
                x=round(x0 + i * (w + CHIP_GAP), 2),
                y=y + (TRAY_H - CHIP_H) / 2,
                w=round(w, 2),
                h=CHIP_H,
                healthy=card.get("healthy", True),
                title=self._chip_title(node["node"], card),
            )
            for i, card in enumerate(node.get("cards", []))
        ]
        if not node.get("reachable", True):
            state = "unreachable"
        else:
            state = "in" if node.get("in_domain") and node.get("ready") else "out"
        imex = (node.get("imex") or "").lower()
        return Tray(
            node=node["node"],
            label=label,
            y=y,
            state=state,
            chips=chips,
            imex="up" if imex == "up" else ("unknown" if not imex else "down"),
            title=self._tray_title(node, state),
        )

    @staticmethod
    def _chip_title(node: str, card: dict[str, Any]) -> str:
        parts = [f"{node} gpu {card['label']}", f"fabric {card.get('fabric_state') or 'not reported'}"]
        if card.get("fabric_status"):
            parts.append(f"status {card['fabric_status']}")
        if card.get("bandwidth"):
            parts.append(f"bandwidth {card['bandwidth']}")
        if not card.get("healthy", True):
            parts.append("unhealthy")
        return ", ".join(parts)

    @staticmethod
    def _tray_title(node: dict[str, Any], state: str) -> str:
        imex = node.get("imex") or "not reported"
        channels = node.get("imex_channels")
        chan = f", channels {', '.join(map(str, channels))}" if channels else ""
        words = {"in": "in the domain", "out": "out of the domain", "unreachable": "unreachable"}[state]
        return f"{node['node']}: {words}; IMEX {imex}{chan}"
