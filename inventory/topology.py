"""Turn a parsed ibnetdiscover scan into the map the console draws.

Pure code, no Django: the view is plain JSON-able data (dicts, lists, strings,
numbers, None). Switches are classified by what they are cabled to, not by
their names, because names are whatever the site chose:

* ``leaf``: cabled to at least one host adapter;
* ``spine``: cabled to switches only (and perhaps its own SHARP aggregation
  node, which lives inside every Quantum switch and is not a host);
* ``other``: neither (a switch the scan saw with no cables, or only to routers).

Every link in a scan is up, since ibnetdiscover only walks live cables; a
link slower than the fabric's most common rate is ``degraded`` (a cable or
transceiver that trained at a lower width or speed).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from inventory.ibnetdiscover import FabricMap, IBNode, Link, normalize_guid

__all__ = ["NO_SWITCH", "build_view", "switch_label"]

NO_SWITCH = "No switch seen: the adapter is not cabled to a fabric, or the scan ran from an isolated port."

# How many slow links a problem sentence names before it just counts them.
_NAMED_LINKS = 5


def build_view(fabric_map: FabricMap, hosts: Mapping[str, Sequence[str]] | None = None) -> dict[str, Any]:
    """The map of one fabric as the console draws it, with the cluster's own adapters marked.

    ``hosts`` maps an adapter's GUID (node or port GUID, in any spelling
    ``normalize_guid`` accepts) to ``(node name, hca)``; an adapter of the scan
    that is not in it is someone else's, and has ``node``/``hca`` None.
    """
    ours = _normalized_hosts(hosts or {})
    aggregation = _aggregation_nodes(fabric_map)
    by_node = _links_by_node(fabric_map.links)
    roles = {g: _role(g, fabric_map, by_node, aggregation) for g in fabric_map.switches}
    rates = [link.gbps for link in fabric_map.links]
    common = _common_gbps(rates)
    links = [_link_view(link, rate, fabric_map, common) for link, rate in zip(fabric_map.links, rates, strict=True)]
    adapters = [_adapter_view(ca, by_node, fabric_map, aggregation, ours) for ca in fabric_map.cas.values()]
    switches = [_switch_view(sw, roles[g], by_node, fabric_map, aggregation) for g, sw in fabric_map.switches.items()]
    switches.sort(key=lambda s: (_ROLE_ORDER[s["role"]], s["label"], s["guid"]))
    leaf_rank = {s["guid"]: i for i, s in enumerate(switches)}
    adapters.sort(key=lambda a: (a["kind"] != "host", leaf_rank.get(a["leaf"], len(leaf_rank)), a["leaf_port"] or 0))
    return {
        "format": fabric_map.format,
        "origin": fabric_map.origin_guid,
        "common_gbps": common,
        "counts": _counts(switches, adapters, links),
        "switches": switches,
        "hosts": adapters,
        "routers": [_node_brief(r) for r in fabric_map.routers.values()],
        "links": links,
        "problems": _problems(fabric_map, adapters, links, common),
    }


def switch_label(description: str, guid: str) -> str:
    """A short name to draw: "A09-P1-IBLEAF-04-04" from "MF0;A09-P1-IBLEAF-04-04:MQM9701/U1"; the GUID if nameless."""
    label = description
    if ";" in label:
        label = label.split(";", 1)[1]
    if ":" in label:
        label = label.split(":", 1)[0]
    return label.strip() or description or guid


# --- classification ---------------------------------------------------------

_ROLE_ORDER = {"spine": 0, "leaf": 1, "other": 2}


def _normalized_hosts(hosts: Mapping[str, Sequence[str]]) -> dict[str, tuple[str, str]]:
    out: dict[str, tuple[str, str]] = {}
    for guid, value in hosts.items():
        g = normalize_guid(guid)
        if g is not None and len(value) >= 2:
            out[g] = (str(value[0]), str(value[1]))
    return out


def _aggregation_nodes(fabric_map: FabricMap) -> set[str]:
    """SHARP aggregation nodes: named so, or sharing a switch's system image GUID (they live in its ASIC)."""
    switch_images = {s.system_guid for s in fabric_map.switches.values() if s.system_guid}
    return {g for g, ca in fabric_map.cas.items() if ca.is_aggregation_node or (ca.system_guid in switch_images)}


def _links_by_node(links: list[Link]) -> dict[str, list[tuple[int, str, int, Link]]]:
    """GUID -> (own port, peer GUID, peer port, link) for every cable it has."""
    out: dict[str, list[tuple[int, str, int, Link]]] = {}
    for link in links:
        out.setdefault(link.a_guid, []).append((link.a_port, link.b_guid, link.b_port, link))
        out.setdefault(link.b_guid, []).append((link.b_port, link.a_guid, link.a_port, link))
    return out


def _role(guid: str, fabric_map: FabricMap, by_node: dict, aggregation: set[str]) -> str:
    peers = [peer for _, peer, _, _ in by_node.get(guid, ())]
    if any(p in fabric_map.cas and p not in aggregation for p in peers):
        return "leaf"
    if any(p in fabric_map.switches for p in peers):
        return "spine"
    return "other"


def _common_gbps(rates: list[float | None]) -> float | None:
    """The most common link rate of the fabric (the highest of equals); None when no link has a known rate."""
    counts = Counter(g for g in rates if g is not None)
    if not counts:
        return None
    return max(counts, key=lambda g: (counts[g], g))


# --- views ------------------------------------------------------------------


def _node_brief(node: IBNode) -> dict[str, Any]:
    return {"guid": node.guid, "description": node.description, "lid": node.lid}


def _switch_view(sw: IBNode, role: str, by_node: dict, fabric_map: FabricMap, aggregation: set[str]) -> dict[str, Any]:
    cables = sorted(by_node.get(sw.guid, ()), key=lambda c: c[0])
    hosts = [peer for _, peer, _, _ in cables if peer in fabric_map.cas and peer not in aggregation]
    sharp = [peer for _, peer, _, _ in cables if peer in aggregation]
    switch_peers = {peer for _, peer, _, _ in cables if peer in fabric_map.switches}
    return {
        **_node_brief(sw),
        "label": switch_label(sw.description, sw.guid),
        "role": role,
        "ports": sw.ports,
        "hosts": list(dict.fromkeys(hosts)),
        "aggregation_node": sharp[0] if sharp else None,
        "switch_links": sum(1 for _, peer, _, _ in cables if peer in fabric_map.switches),
        "switch_peers": sorted(switch_peers),
    }


def _adapter_view(
    ca: IBNode, by_node: dict, fabric_map: FabricMap, aggregation: set[str], ours: dict[str, tuple[str, str]]
) -> dict[str, Any]:
    cables = sorted(by_node.get(ca.guid, ()), key=lambda c: c[0])
    uplinks = [(port, peer, peer_port) for port, peer, peer_port, _ in cables if peer in fabric_map.switches]
    owner = ours.get(ca.guid) or next((ours[g] for g in ca.port_guids.values() if g in ours), None)
    return {
        **_node_brief(ca),
        "kind": "aggregation" if ca.guid in aggregation else "host",
        # A host hangs under the switch its lowest cabled port reaches; a
        # dual-homed one lists every switch in ``leaves``.
        "leaf": uplinks[0][1] if uplinks else None,
        "leaf_port": uplinks[0][2] if uplinks else None,
        "leaves": list(dict.fromkeys(peer for _, peer, _ in uplinks)),
        "port_guids": {str(p): g for p, g in sorted(ca.port_guids.items())},
        "node": owner[0] if owner else None,
        "hca": owner[1] if owner else None,
    }


def _link_view(link: Link, gbps: float | None, fabric_map: FabricMap, common: float | None) -> dict[str, Any]:
    both_switches = link.a_guid in fabric_map.switches and link.b_guid in fabric_map.switches
    return {
        "a": link.a_guid,
        "a_port": link.a_port,
        "b": link.b_guid,
        "b_port": link.b_port,
        "width": link.width,
        "speed": link.speed,
        "gbps": gbps,
        "tier": "fabric" if both_switches else "host",
        "state": "degraded" if gbps is not None and common is not None and gbps < common else "up",
    }


def _counts(switches: list[dict], adapters: list[dict], links: list[dict]) -> dict[str, int]:
    roles = Counter(s["role"] for s in switches)
    return {
        "switches": len(switches),
        "leaves": roles["leaf"],
        "spines": roles["spine"],
        "other_switches": roles["other"],
        "hosts": sum(1 for a in adapters if a["kind"] == "host"),
        "aggregation_nodes": sum(1 for a in adapters if a["kind"] == "aggregation"),
        "ours": sum(1 for a in adapters if a["node"] is not None),
        "links": len(links),
        "degraded_links": sum(1 for link in links if link["state"] == "degraded"),
    }


def _problems(fabric_map: FabricMap, adapters: list[dict], links: list[dict], common: float | None) -> list[str]:
    out: list[str] = []
    if not fabric_map.switches:
        out.append(NO_SWITCH)
    else:
        for a in adapters:
            if a["leaf"] is None:
                who = f"{a['node']} {a['hca']}" if a["node"] else (a["description"] or a["guid"])
                out.append(f"Adapter {who} ({a['guid']}) is in the scan but cabled to no switch.")
    slow = [link for link in links if link["state"] == "degraded"]
    if slow:
        names = ", ".join(_link_words(link, fabric_map) for link in slow[:_NAMED_LINKS])
        more = f" and {len(slow) - _NAMED_LINKS} more" if len(slow) > _NAMED_LINKS else ""
        out.append(
            f"{len(slow)} link(s) run below the fabric's usual {common:g} Gb/s: {names}{more}; "
            "reseat or replace their cables or transceivers."
        )
    out.extend(fabric_map.warnings)
    return out


def _link_words(link: dict, fabric_map: FabricMap) -> str:
    def end(guid: str, port: int) -> str:
        node = fabric_map.node(guid)
        if node is None:
            name = guid
        else:
            name = switch_label(node.description, guid) if node.kind == "switch" else node.description or guid
        return f"{name} port {port}"

    return f"{end(link['a'], link['a_port'])} – {end(link['b'], link['b_port'])} at {link['width']}{link['speed']}"
