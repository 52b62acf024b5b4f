"""Which physical fabric each port is on, against the names the nodes gave them: the analysis itself."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Collection, Iterable
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any, NamedTuple

from inventory.fabrics.counters import _errors_rising, _slow_ports
from inventory.fabrics.facts import (
    _KIND_ORDER,
    FabricReport,
    PhysicalFabric,
    PortFacts,
    PortRef,
    Problem,
    SMChange,
    _Port,
    _who,
    describe_key,
)
from inventory.fabrics.subnet_manager import _sm_events, _sm_problems
from inventory.fabrics.words import _and_list, _aware, _count_nodes, _count_word, _nodes_list
from inventory.ibnetdiscover import normalize_guid

# --- the analysis ---------------------------------------------------------------


def analyze(
    ports: Iterable[PortFacts], sm_changes: Iterable[SMChange] = (), now: datetime | None = None
) -> FabricReport:
    """Group the ports by physical fabric and report what does not add up.

    ``now`` (default: the current UTC time) dates the SM history's windows.
    Naive datetimes are taken as UTC.
    """
    now = _aware(now or datetime.now(UTC))
    derived = [_derive(p) for p in ports]
    groups = _group(derived)
    problems: list[Problem] = _port_problems(derived, set(groups))
    physical = [_physical(key, members) for key, members in groups.items()]
    _label(physical)
    by_key = {p.key: p for p in physical}
    events = _sm_events(sm_changes, {p.sm_guid for p in physical if p.sm_guid})
    for ph in physical:
        ph.sms = [e for e in events if ph.sm_guid and ph.sm_guid in (e.old, e.new)]
        problems += _sm_problems(ph, now)
        problems += _merged_names(ph, groups[ph.key], derived)
        problems += _slow_ports(ph, groups[ph.key])
    problems += _split_names(derived, by_key)
    node_fabrics, node_reasons = _node_fabrics(derived, by_key)
    problems += _split_nodes(node_fabrics, by_key, derived)
    problems += _errors_rising(derived, set(by_key))
    problems.sort(key=lambda p: (_KIND_ORDER.index(p.kind), p.physical or "", p.node or "", p.hca or "", p.port or 0))
    physical.sort(key=lambda p: (p.label, p.key))
    return FabricReport(physical, problems, node_fabrics, node_reasons)


def _text(value: str | None) -> str | None:
    """Blank is absent: the database keeps unknown strings as ""."""
    if value is None:
        return None
    value = str(value).strip()
    return value or None


def _is_active(state: str | None) -> bool | None:
    """True when the port is ACTIVE; None when its state was not reported."""
    s = _text(state)
    return None if s is None else "ACTIVE" in s.upper()


def _is_roce(p: PortFacts) -> bool:
    return _is_ethernet(p.link_layer)


def _is_ethernet(link_layer: str | None) -> bool:
    return (_text(link_layer) or "").lower() == "ethernet"


def _derive(p: PortFacts) -> _Port:
    live, key = _live_and_key(p.state, p.link_layer, p.network, p.sm_guid)
    return _Port(p, PortRef(p.node, p.hca, p.port), live, key, _text(p.declared_fabric))


# Pure, and its arguments take few values in a fleet (a handful of states,
# one SM per fabric): each distinct port is judged once, not once per port.
@lru_cache(maxsize=1024)
def _live_and_key(
    state: str | None, link_layer: str | None, network: str | None, sm_guid: str | None
) -> tuple[bool, str | None]:
    """Whether a port is live (not known to be down), and its physical fabric's key (None: unknown)."""
    key: str | None = None
    if _is_ethernet(link_layer):
        net = _text(network)
        key = f"roce:{net}" if net else None
    elif sm := normalize_guid(sm_guid):
        key = f"sm:{sm}"
    return _is_active(state) is not False, key


def _port_problems(ports: list[_Port], live_keys: set[str]) -> list[Problem]:
    out = []
    for p in ports:
        # A down port may still name the SM it last saw; it belongs to that
        # fabric's page only if the fabric is there now.
        physical = p.key if p.key in live_keys else None
        base = {"fabric": p.declared, "physical": physical, "node": p.ref.node, "hca": p.ref.hca, "port": p.ref.port}
        if not p.live:
            out.append(Problem("port_down", _down_message(p), **base))
        elif p.key is None:
            out.append(Problem("sm_unknown", _unknown_message(p), **base))
    return out


def _down_message(p: _Port) -> str:
    state, phys = _text(p.facts.state) or "?", _text(p.facts.phys_state)
    phys_u = (phys or "").upper()
    if "POLLING" in phys_u:
        hint = "it sees no link partner: check the cable and the switch port at the other end"
    elif "DISABLED" in phys_u:
        hint = "it was disabled: enable it (ibportstate) or on the switch"
    elif "LINKUP" in phys_u:
        hint = "the link trained but no subnet manager brought it up: is an SM running on this fabric?"
    else:
        hint = "check the cable, the transceiver and the switch port"
    where = f"state {state}" + (f", physical state {phys}" if phys else "")
    return f"{_who(p)} is down ({where}): {hint}."


def _unknown_message(p: _Port) -> str:
    placement = "placement keeps the node off multi-node replicas until it is known"
    if _is_roce(p.facts):
        return f"{_who(p)} is RoCE but its network was not reported, so its fabric is unknown; {placement}."
    why = _text(p.facts.sm_error) or "no reason was given (an older agent?)"
    lid = f" at SM LID {p.facts.sm_lid}" if p.facts.sm_lid is not None else ""
    return f"The subnet manager of {_who(p)}{lid} could not be read: {why}; {placement}."


def _group(ports: list[_Port]) -> dict[str, list[_Port]]:
    groups: dict[str, list[_Port]] = defaultdict(list)
    for p in ports:
        if p.live and p.key is not None:
            groups[p.key].append(p)
    return dict(groups)


def _physical(key: str, members: list[_Port]) -> PhysicalFabric:
    names = Counter()
    for name, nodes in _names_on(members).items():
        names[name] = len(nodes)
    lids = Counter(m.facts.sm_lid for m in members if m.facts.sm_lid is not None)
    kind = fabric_kind(key)
    roce = kind == "roce"
    return PhysicalFabric(
        key=key,
        label="",
        kind=kind,
        declared=[n for n, _ in sorted(names.items(), key=lambda kv: (-kv[1], kv[0]))],
        nodes=sorted({m.ref.node for m in members}),
        ports=sorted(m.ref for m in members),
        sm_guid=None if roce else key.partition(":")[2],
        sm_lid=_most_common(lids),
        network=key.partition(":")[2] if roce else None,
        rate_gbps=_common_rate(members),
    )


def fabric_kind(key: str) -> str:
    """A physical fabric's kind by its key: "roce" for a RoCE network, "infiniband" for an SM's subnet."""
    return "roce" if key.startswith("roce:") else "infiniband"


def _most_common(counts: Counter) -> Any:
    """The most common value, the highest of equals; None when there are none."""
    return max(counts, key=lambda v: (counts[v], v)) if counts else None


def _common_rate(members: list[_Port]) -> float | None:
    return _most_common(Counter(m.facts.rate_gbps for m in members if m.facts.rate_gbps is not None))


def _label(physical: list[PhysicalFabric]) -> None:
    """Name each fabric by its declared names, most used first; by its SM or network when nobody named it."""
    for ph in physical:
        ph.label = " / ".join(ph.declared) or describe_key(ph.key, ph.sm_lid)
    seen = Counter(ph.label for ph in physical)
    for ph in physical:
        if seen[ph.label] > 1:  # one name on two fabrics: tell them apart
            ph.label = f"{ph.label} ({describe_key(ph.key, ph.sm_lid)})"


def _names_on(members: list[_Port]) -> dict[str, set[str]]:
    """Declared name -> the nodes whose live ports on these members carry it."""
    out: dict[str, set[str]] = defaultdict(set)
    for m in members:
        if m.declared:
            out[m.declared].add(m.ref.node)
    return out


# --- naming: one name on two fabrics, two names on one ---------------------------


def _split_names(ports: list[_Port], by_key: dict[str, PhysicalFabric]) -> list[Problem]:
    """One declared name over two physical fabrics: the nodes on the smaller side are likely mislabelled.

    The side that is "right" has the most nodes; between equals, the side
    whose fabric carries no other name, since the odd side is usually a node
    on a fabric the others call something else.
    """
    sides: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for p in ports:
        if p.live and p.key and p.declared:
            sides[p.declared][p.key].add(p.ref.node)
    out: list[Problem] = []
    for name, by_phys in sorted(sides.items()):
        if len(by_phys) < 2:
            continue
        # Most nodes first; between equals, the fabric carrying fewer other names.
        rank = {k: (len(nodes), -sum(1 for d in by_key[k].declared if d != name)) for k, nodes in by_phys.items()}
        ranked = sorted(sorted(by_phys), key=lambda k: rank[k], reverse=True)
        if rank[ranked[0]] == rank[ranked[1]]:
            out.append(_split_name_undecided(name, ranked, by_phys, by_key))
        else:
            out += _split_name_minority(name, ranked, by_phys, by_key)
    return out


def _split_name_undecided(
    name: str, ranked: list[str], by_phys: dict[str, set[str]], by_key: dict[str, PhysicalFabric]
) -> Problem:
    sides = "; ".join(f"{describe_key(k, by_key[k].sm_lid)}: {_nodes_list(by_phys[k])}" for k in ranked)
    return Problem(
        "split_name",
        f"The fabric name '{name}' covers {_count_word(len(ranked))} physical fabrics with nothing to tell "
        f"which is right ({sides}): check each node's agent configuration and cabling.",
        fabric=name,
    )


def _split_name_minority(
    name: str, ranked: list[str], by_phys: dict[str, set[str]], by_key: dict[str, PhysicalFabric]
) -> list[Problem]:
    main = ranked[0]
    main_words = f"{_count_nodes(by_phys[main])} on {describe_key(main, by_key[main].sm_lid)}"
    out = []
    for key in ranked[1:]:
        others = [d for d in by_key[key].declared if d != name]
        there = f", which the other nodes there call '{others[0]}'" if others else ""
        for node in sorted(by_phys[key]):
            out.append(
                Problem(
                    "split_name",
                    f"The fabric name '{name}' covers {_count_word(len(ranked))} physical fabrics: {main_words}, "
                    f"and {node} on {describe_key(key, by_key[key].sm_lid)}{there}. {node} is likely mislabelled: "
                    f"correct the fabric names in its agent configuration, or its cabling if it belongs on '{name}'.",
                    fabric=name,
                    physical=key,
                    node=node,
                )
            )
    return out


def _merged_names(ph: PhysicalFabric, members: list[_Port], ports: list[_Port]) -> list[Problem]:
    """Two declared names on one physical fabric: the nodes of the smaller name are likely the odd ones out.

    Between names with as many nodes here, the odd one is the name whose
    nodes are mostly elsewhere.
    """
    names = _names_on(members)
    if len(names) < 2:
        return []
    everywhere: dict[str, set[str]] = defaultdict(set)
    for p in ports:
        if p.live and p.key and p.declared:
            everywhere[p.declared].add(p.ref.node)

    def rank(name: str) -> tuple[int, float]:
        return len(names[name]), len(names[name]) / len(everywhere[name])

    ranked = sorted(sorted(names), key=rank, reverse=True)  # equals in name order
    where = describe_key(ph.key, ph.sm_lid)
    listing = _and_list([f"'{n}' ({_count_nodes(names[n])})" for n in ranked])
    count = _count_word(len(ranked))
    if rank(ranked[0]) == rank(ranked[1]):
        return [
            Problem(
                "merged_names",
                f"The physical fabric {where} carries {count} names, {listing}, in equal measure: it is one "
                "fabric, so rename them to one, or if they should be separate, separate their cabling and "
                "subnet managers.",
                physical=ph.key,
            )
        ]
    out = []
    for name in ranked[1:]:
        for node in sorted(names[name]):
            out.append(
                Problem(
                    "merged_names",
                    f"The physical fabric {where} carries {count} names: {listing}. {node} is likely mislabelled "
                    f"'{name}' where its peers say '{ranked[0]}': correct the fabric names in its agent "
                    "configuration, or its cabling.",
                    fabric=name,
                    physical=ph.key,
                    node=node,
                )
            )
    return out


# --- nodes for placement ---------------------------------------------------------


def _node_fabrics(ports: list[_Port], by_key: dict[str, PhysicalFabric]) -> tuple[dict, dict]:
    keys: dict[str, list[str]] = defaultdict(list)
    unknown: dict[str, list[_Port]] = defaultdict(list)
    any_live: set[str] = set()
    for p in ports:
        keys.setdefault(p.ref.node, [])
        if not p.live:
            continue
        any_live.add(p.ref.node)
        if p.key is None:
            unknown[p.ref.node].append(p)
        elif p.key not in keys[p.ref.node]:
            keys[p.ref.node].append(p.key)
    reasons: dict[str, str] = {}
    for node, node_keys in keys.items():
        node_keys.sort()
        why = _why_no_fabric(node in any_live, bool(unknown[node]), node_keys)
        if why == _ALL_DOWN:
            reasons[node] = f"every InfiniBand/RoCE port of {node} is down"
        elif why == _UNKNOWN:
            ports_s = ", ".join(f"{p.ref.hca} port {p.ref.port}" for p in unknown[node])
            reasons[node] = f"the fabric of {node}'s {ports_s} is unknown (its subnet manager could not be read)"
        elif why == _SPLIT:
            labels = ", ".join(by_key[k].label for k in node_keys)
            reasons[node] = f"the ports of {node} are on {_count_word(len(node_keys))} physical fabrics ({labels})"
    return dict(keys), reasons


_ALL_DOWN, _UNKNOWN, _SPLIT = "all down", "unknown", "split"


def _why_no_fabric(any_live: bool, any_unknown: bool, keys: Collection[str]) -> str | None:
    """Which rule keeps a node from having one fabric (_ALL_DOWN, _UNKNOWN, _SPLIT); None when it has one.

    ``any_unknown`` is whether a live port's fabric is unknown; ``keys`` the
    fabrics of its live ports. The one rule for the analysis' reasons and for
    :func:`node_fabric_keys`.
    """
    if not any_live:
        return _ALL_DOWN
    if any_unknown:
        return _UNKNOWN
    if len(keys) > 1:
        return _SPLIT
    return None


class PortLink(NamedTuple):
    """What decides the physical fabric a port puts its node on; the rest of :class:`PortFacts` does not."""

    node: str
    state: str | None
    link_layer: str | None
    network: str | None
    sm_guid: str | None

    @classmethod
    def of(cls, p: PortFacts) -> PortLink:
        return cls(p.node, p.state, p.link_layer, p.network, p.sm_guid)


def node_fabric_keys(links: Iterable[PortLink]) -> dict[str, str]:
    """Node → the one physical fabric key its live ports are all on, for each node that has one.

    ``analyze(ports).fabric_of(node)`` for every node of ``ports`` whose answer
    is not None, without the rest of the analysis: what placement reads each
    round. A port that appears twice counts once.
    """
    keys: dict[str, set[str]] = defaultdict(set)
    any_live: set[str] = set()
    unknown: set[str] = set()
    for link in links:
        live, key = _live_and_key(link.state, link.link_layer, link.network, link.sm_guid)
        node_keys = keys[link.node]  # a node with no live port is judged too: it has none
        if not live:
            continue
        any_live.add(link.node)
        if key is None:
            unknown.add(link.node)
        else:
            node_keys.add(key)
    return {
        node: next(iter(node_keys))
        for node, node_keys in keys.items()
        if _why_no_fabric(node in any_live, node in unknown, node_keys) is None
    }


class PortPlace(NamedTuple):
    """Where a port is (node, adapter, number) with what decides its physical fabric (:class:`PortLink`)."""

    node: str
    hca: str
    port: int
    state: str | None
    link_layer: str | None
    network: str | None
    sm_guid: str | None

    @classmethod
    def of(cls, p: PortFacts) -> PortPlace:
        return cls(p.node, p.hca, p.port, p.state, p.link_layer, p.network, p.sm_guid)


def physical_ports(places: Iterable[PortPlace]) -> dict[str, list[PortRef]]:
    """Each physical fabric's key → its ports, sorted: ``analyze(ports).physical``'s keys and ``ports``,
    without the rest of the analysis (what choosing a fabric's scanner reads, every minute)."""
    groups: dict[str, list[PortRef]] = defaultdict(list)
    for p in places:
        live, key = _live_and_key(p.state, p.link_layer, p.network, p.sm_guid)
        if live and key is not None:
            groups[key].append(PortRef(p.node, p.hca, p.port))
    return {key: sorted(refs) for key, refs in groups.items()}


class PortName(NamedTuple):
    """What names the physical fabric a port is on, beside what decides which it is (:class:`PortLink`).

    ``declared`` is the fabric name its node gave it, ``sm_lid`` the LID it
    reaches the SM at; ``ports`` how many of the node's ports share all of
    this (a reading that groups them says so; one port each by default).
    """

    node: str
    state: str | None
    link_layer: str | None
    network: str | None
    sm_guid: str | None
    declared: str | None
    sm_lid: int | None
    ports: int = 1

    @classmethod
    def of(cls, p: PortFacts) -> PortName:
        return cls(p.node, p.state, p.link_layer, p.network, p.sm_guid, p.declared_fabric, p.sm_lid)


def node_fabric_labels(rows: Iterable[PortName]) -> dict[str, str]:
    """Node → the label of the one physical fabric its live ports are all on, for each node that has one.

    ``analyze(ports).fabric(analyze(ports).fabric_of(node)).label`` for every
    such node, without the rest of the analysis: what the reachability sweep
    groups silent nodes by (a partition of ``fabric <label>``), where the
    whole analysis was half its CPU after a fleet-wide silence. The label is
    made as the analysis makes it: the names declared on the fabric by the
    most nodes first, else its SM at the LID most of its ports reach it at.
    """
    keys, physical = _named_fabrics(rows)
    label = {ph.key: ph.label for ph in physical}
    return {node: label[key] for node, key in keys.items()}


def sm_report(
    rows: Iterable[PortName], sm_changes: Iterable[SMChange] = (), now: datetime | None = None
) -> FabricReport:
    """The part of ``analyze`` the doctor sweep reads, from what names the fabrics (:class:`PortName` rows).

    The same as ``analyze(ports, sm_changes, now)`` gives for: ``fabric_of``
    of every node; each physical fabric's key, label, declared names, SM
    (GUID and LID) and SM history (``sms``); and the ``sm_flapping``
    problems, in the analysis' order. Nothing else: no other problem, and the
    fabrics' nodes, ports and rates are empty (``why_no_fabric`` does not say
    why). At 10,000 nodes the whole analysis (seventy thousand ports, their
    counters compared) was most of a sweep that needed only this.
    """
    now = _aware(now or datetime.now(UTC))
    keys, physical = _named_fabrics(rows)
    events = _sm_events(sm_changes, {p.sm_guid for p in physical if p.sm_guid})
    problems: list[Problem] = []
    for ph in physical:
        ph.sms = [e for e in events if ph.sm_guid and ph.sm_guid in (e.old, e.new)]
        problems += _sm_problems(ph, now)
    problems.sort(key=lambda p: (_KIND_ORDER.index(p.kind), p.physical or "", p.node or "", p.hca or "", p.port or 0))
    physical.sort(key=lambda p: (p.label, p.key))
    return FabricReport(physical, problems, {node: [key] for node, key in keys.items()}, {})


def _named_fabrics(rows: Iterable[PortName]) -> tuple[dict[str, str], list[PhysicalFabric]]:
    """Node → its one physical fabric key, and every physical fabric with a live port, labelled as ``analyze`` does.

    The fabrics carry their key, kind, declared names, SM GUID and LID (or
    RoCE network) and label; not their nodes, ports or rate.
    """
    rows = list(rows)
    keys = node_fabric_keys(PortLink(r.node, r.state, r.link_layer, r.network, r.sm_guid) for r in rows)
    names: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    lids: dict[str, Counter] = {}  # every fabric with a live port, with the LIDs its ports reach the SM at
    for r in rows:
        live, key = _live_and_key(r.state, r.link_layer, r.network, r.sm_guid)
        if not live or key is None:
            continue
        counts = lids.setdefault(key, Counter())
        if declared := _text(r.declared):
            names[key][declared].add(r.node)
        if r.sm_lid is not None:
            counts[r.sm_lid] += r.ports
    physical = []
    for key, counts in lids.items():
        named = {name: len(nodes) for name, nodes in names[key].items()}
        roce = key.startswith("roce:")
        physical.append(
            PhysicalFabric(
                key=key,
                label="",
                kind="roce" if roce else "infiniband",
                declared=[n for n, _ in sorted(named.items(), key=lambda kv: (-kv[1], kv[0]))],
                nodes=[],
                ports=[],
                sm_guid=None if roce else key.partition(":")[2],
                sm_lid=_most_common(counts),
                network=key.partition(":")[2] if roce else None,
            )
        )
    _label(physical)
    return keys, physical


def _split_nodes(
    node_fabrics: dict[str, list[str]], by_key: dict[str, PhysicalFabric], ports: list[_Port]
) -> list[Problem]:
    """A node whose live ports reach two physical fabrics: NCCL on it could reach for a peer through the wrong one."""
    out = []
    for node, keys in sorted(node_fabrics.items()):
        if len(keys) < 2:
            continue
        parts = []
        for k in keys:
            hcas = sorted({f"{p.ref.hca}/{p.ref.port}" for p in ports if p.ref.node == node and p.key == k and p.live})
            parts.append(f"{', '.join(hcas)} on {by_key[k].label}")
        out.append(
            Problem(
                "split_node",
                f"The ports of {node} are on {_count_word(len(keys))} physical fabrics ({'; '.join(parts)}): "
                "placement keeps it off multi-node replicas; cable all its adapters to one fabric, or tell the "
                "agent to use only one fabric's adapters.",
                node=node,
            )
        )
    return out
