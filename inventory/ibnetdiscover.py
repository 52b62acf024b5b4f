"""Read the output of ``ibnetdiscover`` into a map of one InfiniBand fabric.

Two formats are understood, chosen by the first line that is not a comment:

* the default topology file: ``vendid=``/``devid=``/``sysimgguid=``/``switchguid=``
  or ``caguid=`` lines, then a ``Switch``/``Ca``/``Rt`` header and one line per
  connected port (every cable is listed from both of its ends);
* the ports report of ``ibnetdiscover -p``: one line per port, connected or not.

Pure code: no Django, no I/O. Anything that is not ibnetdiscover output raises
:class:`TopologyParseError` with a sentence and the line number, never another
exception, because the text comes from a node over the network and may be
truncated or mangled on the way.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import NamedTuple

__all__ = [
    "FabricMap",
    "IBNode",
    "Link",
    "TopologyParseError",
    "lane_gbps",
    "map_from_json",
    "map_to_json",
    "normalize_guid",
    "parse",
]


class TopologyParseError(ValueError):
    """The text is not ibnetdiscover output; ``line`` is where reading stopped (None: the whole text)."""

    def __init__(self, message: str, line: int | None = None) -> None:
        self.line = line
        self.reason = message
        super().__init__(f"line {line}: {message}" if line is not None else message)


# Per-lane data rate in Gb/s of each InfiniBand speed name, as ibstat adds
# them up (4x HDR = 200). FDR10 is FDR signalling at QDR's rate.
_LANE_GBPS = {
    "SDR": 2.5,
    "DDR": 5.0,
    "QDR": 10.0,
    "FDR10": 10.0,
    "FDR": 14.0,
    "EDR": 25.0,
    "HDR": 50.0,
    "NDR": 100.0,
    "XDR": 200.0,
}


def lane_gbps(speed: str) -> float | None:
    """Gb/s of one lane at ``speed`` ("NDR"); None when the speed is not a known name ("???")."""
    return _LANE_GBPS.get(speed.upper())


_HEX_GUID = re.compile(r"(?:0x)?([0-9a-f]{1,16})")
_COLON_GUID = re.compile(r"[0-9a-f]{4}(?::[0-9a-f]{4}){3}")


@lru_cache(maxsize=8192)  # a scan names the same few switches thousands of times
def normalize_guid(text: str | None) -> str | None:
    """One spelling for a GUID: ``0x`` and 16 lower-case hex digits.

    Accepts what the tools print: ``0x58a2e10300a7820e`` (ibstat, ibnetdiscover
    -p), ``58a2:e103:00a7:820e`` (sysfs), ``58a2e10300a7820e`` and the node names
    ibnetdiscover makes up (``S-…``, ``H-…``, ``R-…``). None when the text is
    empty, not a GUID, or all zeros (a port that has no subnet manager reports
    a zero GUID, which identifies nothing).
    """
    if not text:
        return None
    t = text.strip().lower()
    if len(t) > 2 and t[1] == "-" and t[0] in "shr":
        t = t[2:]
    if _COLON_GUID.fullmatch(t):
        t = t.replace(":", "")
    m = _HEX_GUID.fullmatch(t)
    if not m:
        return None
    value = int(m.group(1), 16)
    return f"0x{value:016x}" if value else None


@dataclass
class IBNode:
    """A switch, adapter (CA) or router seen by the scan.

    ``lid`` is the switch's LID, or an adapter's lowest port's; None when the
    scan did not say. ``ports`` is the port count from the block header; None
    in the ports report, which does not print it. ``description`` is the
    node description with its padding trimmed ("" when it has none).
    """

    guid: str
    kind: str  # "switch", "ca" or "router"
    description: str = ""
    lid: int | None = None
    ports: int | None = None
    name: str = ""
    system_guid: str | None = None
    vendor_id: str | None = None
    device_id: str | None = None
    port_guids: dict[int, str] = field(default_factory=dict)
    port_lids: dict[int, int] = field(default_factory=dict)

    @property
    def is_aggregation_node(self) -> bool:
        """A SHARP aggregation node: a CA living inside a switch, not a host."""
        return self.kind == "ca" and "aggregation node" in self.description.lower()


@dataclass(frozen=True)
class Link:
    """One cable, from ``a`` to ``b``; a and b are ordered so that the same cable always reads the same."""

    a_guid: str
    a_port: int
    b_guid: str
    b_port: int
    width: str  # "4x"
    speed: str  # "NDR"; "???" when the port did not say

    @property
    def gbps(self) -> float | None:
        """Lanes × lane rate (4x NDR = 400); None when the width or speed is not known."""
        lane = lane_gbps(self.speed)
        lanes = self.width.lower().rstrip("x")
        if lane is None or not lanes.isdigit():
            return None
        return int(lanes) * lane

    def ends(self) -> tuple[tuple[str, int], tuple[str, int]]:
        return (self.a_guid, self.a_port), (self.b_guid, self.b_port)


@dataclass
class FabricMap:
    """What one scan saw: nodes by GUID (in the order the scan listed them) and each cable once.

    ``warnings`` are sentences about oddities that did not stop the reading
    (a port listed with two different peers, a peer the scan never
    described). ``origin_guid`` is the port the scan ran from, None when the
    file does not say. ``format`` is "default" or "ports" (``-p``).
    """

    switches: dict[str, IBNode] = field(default_factory=dict)
    cas: dict[str, IBNode] = field(default_factory=dict)
    links: list[Link] = field(default_factory=list)
    routers: dict[str, IBNode] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    origin_guid: str | None = None
    format: str = "default"

    def node(self, guid: str) -> IBNode | None:
        return self.switches.get(guid) or self.cas.get(guid) or self.routers.get(guid)

    def all_nodes(self) -> Iterable[IBNode]:
        yield from self.switches.values()
        yield from self.cas.values()
        yield from self.routers.values()


# --- keeping --------------------------------------------------------------
#
# A scan is parsed once, when it is uploaded, and kept as this plain JSON; a
# page reads it back without running the parser again (a large fabric's text
# is megabytes of regular expressions).


def _node_to_json(n: IBNode) -> dict:
    return {
        "guid": n.guid,
        "kind": n.kind,
        "description": n.description,
        "lid": n.lid,
        "ports": n.ports,
        "name": n.name,
        "system_guid": n.system_guid,
        "vendor_id": n.vendor_id,
        "device_id": n.device_id,
        # JSON keys are text; map_from_json turns the port numbers back into ints.
        "port_guids": {str(k): v for k, v in n.port_guids.items()},
        "port_lids": {str(k): v for k, v in n.port_lids.items()},
    }


def map_to_json(fmap: FabricMap) -> dict:
    """``fmap`` as JSON-able data that :func:`map_from_json` reads back into an equal map."""
    return {
        "format": fmap.format,
        "origin_guid": fmap.origin_guid,
        "warnings": list(fmap.warnings),
        "nodes": [_node_to_json(n) for n in fmap.all_nodes()],
        "links": [[k.a_guid, k.a_port, k.b_guid, k.b_port, k.width, k.speed] for k in fmap.links],
    }


def map_from_json(data: dict) -> FabricMap:
    """The map :func:`map_to_json` wrote; nodes keep the order the scan listed them in."""
    fmap = FabricMap(format=data["format"], origin_guid=data["origin_guid"], warnings=list(data["warnings"]))
    for raw in data["nodes"]:
        node = IBNode(
            **{k: v for k, v in raw.items() if k not in ("port_guids", "port_lids")},
            port_guids={int(k): v for k, v in raw["port_guids"].items()},
            port_lids={int(k): v for k, v in raw["port_lids"].items()},
        )
        getattr(fmap, _TABLES[node.kind])[node.guid] = node
    fmap.links = [Link(*link) for link in data["links"]]
    return fmap


# --- reading -------------------------------------------------------------

_KINDS = {"switch": "switch", "ca": "ca", "rt": "router", "sw": "switch"}
_TABLES = {"switch": "switches", "ca": "cas", "router": "routers"}

# Numbers are bounded so that a mangled line with thousands of digits is
# refused by the pattern instead of tripping int()'s digit limit.
_NUM = r"\d{1,9}"
_HEX = r"[0-9a-fA-F]{1,16}"

_KEY_VALUE = re.compile(r"(vendid|devid|sysimgguid|switchguid|caguid|rtguid)=(\S+?)(?:\((\w*)\))?\s*(?:#.*)?")
_HEADER = re.compile(rf'(Switch|Ca|Rt)\s+({_NUM})\s+"([^"]*)"\s*(?:#\s*(.*))?')
_SWITCH_TAIL = re.compile(rf'"(.*)"\s+(?:enhanced|base)\s+port\s+0\s+lid\s+({_NUM})\s+lmc\s+{_NUM}.*')
_DESC_TAIL = re.compile(r'"(.*)".*')
# [port](port guid)  "peer"[peer port](peer port guid)  # lid L lmc 0 "peer desc" lid N 4xNDR
# The local "lid L lmc 0" is printed for adapters' ports only; the port GUIDs
# only for adapters' ports too.
_PORT = re.compile(
    rf"\[({_NUM})\](?:\[ext {_NUM}\])?(?:\(({_HEX})\))?\s+"
    rf'"([^"]*)"\[({_NUM})\](?:\[ext {_NUM}\])?(?:\(({_HEX})\))?\s*#\s*'
    rf'(?:lid\s+({_NUM})\s+lmc\s+{_NUM}\s+)?"(.*)"\s+lid\s+({_NUM})\s+({_NUM})x(\w+).*'
)
_ORIGIN = re.compile(rf"#\s*Initiated from node\s+({_HEX})")

_PORTS_LINE = re.compile(rf"(CA|SW|RT)\s+({_NUM})\s+({_NUM})\s+0x({_HEX})\s+({_NUM}x)\s+(\S+)\s*(.*)")
_PORTS_PEER = re.compile(rf"-\s+(CA|SW|RT)\s+({_NUM})\s+({_NUM})\s+0x({_HEX})\s+\(\s*'(.*)'\s+-\s+'(.*)'\s*\)")
_PORTS_ALONE = re.compile(r"'(.*)'")


def parse(text: str | bytes) -> FabricMap:
    """Read ibnetdiscover output (either format) into a :class:`FabricMap`.

    Raises :class:`TopologyParseError` when the text is empty or is not
    ibnetdiscover output; an isolated adapter (one CA, no switch) is a valid
    scan and reads as a map with one CA and no links.
    """
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    if not isinstance(text, str):
        raise TopologyParseError(f"the scan must be text, not {type(text).__name__}")
    lines = text.splitlines()
    first = _first_content_line(lines)
    if first is None:
        raise TopologyParseError(
            "the scan is empty: ibnetdiscover printed no switch or adapter (did it run, as root, on a port that is up?)"
        )
    reader = _PortsReader() if _PORTS_LINE.fullmatch(lines[first].strip()) else _DefaultReader()
    fmap = reader.read(lines)
    if not fmap.switches and not fmap.cas and not fmap.routers:
        raise TopologyParseError("the scan lists no switch and no adapter, only comments and settings")
    return fmap


def _first_content_line(lines: list[str]) -> int | None:
    for i, raw in enumerate(lines):
        s = raw.strip()
        if s and not s.startswith("#"):
            return i
    return None


def _snippet(line: str) -> str:
    s = line.strip()
    return repr(s if len(s) <= 60 else s[:57] + "...")


class _Builder:
    """Collects nodes and cables; shared by both readers."""

    def __init__(self, fmt: str) -> None:
        self.map = FabricMap(format=fmt)
        # (guid, port) -> the other end, to list each cable once and notice a
        # port the scan claims is cabled to two places.
        self.peer: dict[tuple[str, int], tuple[str, int]] = {}

    def node(self, guid: str, kind: str) -> IBNode:
        table: dict[str, IBNode] = getattr(self.map, _TABLES[kind])
        found = table.get(guid)
        if found is None:
            other = self.map.node(guid)
            if other is not None:
                # The same GUID as two kinds is a mangled file, not a fabric.
                raise _Conflict(f"GUID {guid} is listed both as a {other.kind} and as a {kind}")
            found = table[guid] = IBNode(guid=guid, kind=kind)
        return found

    def link(self, a: tuple[str, int], b: tuple[str, int], width: str, speed: str) -> None:
        if a == b:
            self.map.warnings.append(f"Port {a[1]} of {a[0]} is listed as cabled to itself; that line is ignored.")
            return
        if b < a:
            a, b = b, a
        known_a, known_b = self.peer.get(a), self.peer.get(b)
        if known_a == b:
            return  # the same cable, seen from its other end
        for end, known, new in ((a, known_a, b), (b, known_b, a)):
            if known is not None:
                self.map.warnings.append(
                    f"Port {end[1]} of {end[0]} is listed as cabled both to port {known[1]} of {known[0]} "
                    f"and to port {new[1]} of {new[0]}; the scan may merge two runs, and both cables are kept."
                )
        self.peer.setdefault(a, b)
        self.peer.setdefault(b, a)
        self.map.links.append(Link(a[0], a[1], b[0], b[1], width, speed))


class _Conflict(Exception):
    """A contradiction inside the file; the reader turns it into a TopologyParseError with the line."""


class _PortLine(NamedTuple):
    """A port line of the default format, kept until every block has been read."""

    number: int
    here: tuple[str, int]
    peer_name: str
    peer_port: int
    peer_port_guid: str | None
    peer_desc: str
    peer_lid: int
    width: str
    speed: str


class _DefaultReader:
    """The topology file ibnetdiscover prints without options."""

    def __init__(self) -> None:
        self.b = _Builder("default")
        self.settings: dict[str, tuple[str, str | None]] = {}
        self.current: IBNode | None = None
        self.names: dict[str, str] = {}  # the name a header uses -> GUID
        # Port lines whose peer is known only by name, resolved at the end
        # because the peer's block may come later in the file.
        self.pending: list[_PortLine] = []
        self.headers: set[str] = set()

    def read(self, lines: list[str]) -> FabricMap:
        for number, raw in enumerate(lines, start=1):
            try:
                self.line(raw.strip(), number)
            except _Conflict as e:
                raise TopologyParseError(str(e), number) from None
        for pending in self.pending:
            try:
                self.resolve(pending)
            except _Conflict as e:
                raise TopologyParseError(str(e), pending.number) from None
        return self.b.map

    def line(self, s: str, number: int) -> None:
        if not s:
            return
        first = s[0]
        if first == "[":  # most lines: test for them first
            self.port(s, number)
        elif first == "#":
            m = _ORIGIN.match(s)
            if m and self.b.map.origin_guid is None:
                self.b.map.origin_guid = normalize_guid(m.group(1))
        elif m := _KEY_VALUE.fullmatch(s):
            self.settings[m.group(1)] = (m.group(2), m.group(3))
        elif m := _HEADER.fullmatch(s):
            self.header(m, number)
        else:
            raise TopologyParseError(
                f"{_snippet(s)} is not ibnetdiscover output: expected a Switch or Ca line, "
                'a port line such as [1] "H-…"[1], or a setting such as caguid=0x…',
                number,
            )

    def header(self, m: re.Match[str], number: int) -> None:
        kind = _KINDS[m.group(1).lower()]
        name = m.group(3)
        setting = {"switch": "switchguid", "ca": "caguid", "router": "rtguid"}[kind]
        guid = normalize_guid(self.settings.get(setting, ("", None))[0]) or normalize_guid(name)
        if guid is None:
            raise TopologyParseError(
                f'the {m.group(1)} named "{name}" has no GUID: no {setting}= line precedes it '
                "and its name is not S-/H-/R- followed by one",
                number,
            )
        node = self.b.node(guid, kind)
        if guid in self.headers:
            self.b.map.warnings.append(
                f"Line {number}: {guid} has a second block; the scan may merge two runs, and the last one is kept."
            )
        self.headers.add(guid)
        node.name, node.ports = name, int(m.group(2))
        self.describe(node, kind, m.group(4) or "")
        sys_guid = self.settings.get("sysimgguid", ("", None))[0]
        node.system_guid = normalize_guid(sys_guid)
        node.vendor_id = self.settings.get("vendid", (None, None))[0]
        node.device_id = self.settings.get("devid", (None, None))[0]
        self.settings.clear()
        self.names[name] = guid
        self.current = node

    @staticmethod
    def describe(node: IBNode, kind: str, tail: str) -> None:
        if kind == "switch" and (t := _SWITCH_TAIL.fullmatch(tail)):
            node.description, node.lid = t.group(1).strip(), int(t.group(2))
        elif t := _DESC_TAIL.fullmatch(tail):
            node.description = t.group(1).strip()

    def port(self, s: str, number: int) -> None:
        here = self.current
        if here is None:
            raise TopologyParseError("a port line comes before any Switch or Ca line", number)
        m = _PORT.fullmatch(s)
        if m is None:
            raise TopologyParseError(
                f'{_snippet(s)} is not a port line: expected [port] "peer"[port] # "peer description" lid N 4xNDR',
                number,
            )
        port_s, port_guid, peer_name, peer_port, peer_port_guid, lid, peer_desc, peer_lid, lanes, speed = m.groups()
        port = int(port_s)
        if port_guid and (pg := normalize_guid(port_guid)):
            here.port_guids[port] = pg
        if lid is not None and here.kind != "switch":
            here.port_lids.setdefault(port, int(lid))
            here.lid = here.port_lids[min(here.port_lids)]
        self.pending.append(
            _PortLine(
                number,
                (here.guid, port),
                peer_name,
                int(peer_port),
                peer_port_guid,
                peer_desc.strip(),
                int(peer_lid),
                lanes + "x",
                speed,
            )
        )

    def resolve(self, p: _PortLine) -> None:
        guid = self.names.get(p.peer_name) or normalize_guid(p.peer_name)
        if guid is None:
            self.b.map.warnings.append(
                f'Line {p.number}: the peer "{p.peer_name}" is described nowhere in the scan and its name '
                "carries no GUID, so that cable is left out."
            )
            return
        peer = self.b.map.node(guid)
        if peer is None:
            # A peer the file never describes (a truncated upload): keep what
            # the port line says of it rather than lose the cable.
            kind = {"s": "switch", "r": "router"}.get(p.peer_name[:1].lower(), "ca")
            peer = self.b.node(guid, kind)
            peer.name, peer.description = p.peer_name, p.peer_desc
            self.b.map.warnings.append(
                f'Line {p.number}: "{p.peer_name}" is cabled here but has no block of its own '
                "(the scan may be cut short); it is kept with what this line says of it."
            )
        if peer.kind == "switch":
            if peer.lid is None:
                peer.lid = p.peer_lid
        else:
            peer.port_lids.setdefault(p.peer_port, p.peer_lid)
            if peer.lid is None:
                peer.lid = p.peer_lid
            if p.peer_port_guid and (pg := normalize_guid(p.peer_port_guid)):
                peer.port_guids.setdefault(p.peer_port, pg)
        self.b.link(p.here, (guid, p.peer_port), p.width, p.speed)


class _PortsReader:
    """The ports report of ``ibnetdiscover -p``.

    Its GUIDs are port GUIDs: the same as the node GUID for a switch, and for
    an adapter the port's own (on ConnectX cards, port 1's equals the node's).
    """

    def __init__(self) -> None:
        self.b = _Builder("ports")

    def read(self, lines: list[str]) -> FabricMap:
        for number, raw in enumerate(lines, start=1):
            s = raw.strip()
            if not s or s.startswith("#"):
                continue
            try:
                self.line(s, number)
            except _Conflict as e:
                raise TopologyParseError(str(e), number) from None
        return self.b.map

    def line(self, s: str, number: int) -> None:
        m = _PORTS_LINE.fullmatch(s)
        if m is None:
            raise TopologyParseError(
                f"{_snippet(s)} is not a line of ibnetdiscover -p: expected "
                "'SW  1719  1 0x… 4x EDR - CA …' or an unconnected port '… 4x ???  'name''",
                number,
            )
        kind, lid, port, guid, width, speed, rest = m.groups()
        if peer := _PORTS_PEER.fullmatch(rest):
            pkind, plid, pport, pguid, desc, pdesc = peer.groups()
            here = self.endpoint(kind, guid, int(lid), int(port), desc)
            there = self.endpoint(pkind, pguid, int(plid), int(pport), pdesc)
            self.b.link(here, there, width, speed)
        elif alone := _PORTS_ALONE.fullmatch(rest):
            # An unconnected port: it tells us the node exists, no more.
            self.endpoint(kind, guid, int(lid), int(port), alone.group(1))
        else:
            raise TopologyParseError(
                f"{_snippet(s)} has a port but neither a peer \"- CA 134 1 0x… ( 'a' - 'b' )\" nor a quoted name",
                number,
            )

    def endpoint(self, kind: str, hex_guid: str, lid: int, port: int, desc: str) -> tuple[str, int]:
        guid = normalize_guid(hex_guid)
        if guid is None:
            raise _Conflict(f"the GUID 0x{hex_guid} is zero, which no port has")
        node = self.b.node(guid, _KINDS[kind.lower()])
        if not node.description:
            node.description = desc.strip()
        if node.kind == "switch":
            node.lid = node.lid if node.lid is not None else lid
        else:
            node.port_guids.setdefault(port, guid)
            node.port_lids.setdefault(port, lid)
            node.lid = node.port_lids[min(node.port_lids)]
        return guid, port
