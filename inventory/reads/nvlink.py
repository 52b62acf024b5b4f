"""The NVLink domains report: each domain, its nodes and cards, and what keeps any of them out.

A node is in its domain when every card has joined it (fabric state
Completed, status Success, the domain's ClusterUUID and CliqueId). Multi-node
replicas also need IMEX up with a channel, so a node with IMEX down is out
too, with that reason. Degraded bandwidth is joined but amber: a warning, not
a reason to be out.

A card that left its domain usually still reports the domain's ClusterUUID,
which is how its node stays listed under the rack it belongs to. A node whose
cards are trying to join but name no domain at all is listed under
``unassigned`` rather than dropped, since "which rack is this tray in" is then
the first thing to find out.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, NamedTuple

from django.db.models import Q

from agent import nvlink_rules
from core import cycles
from inventory.devices import mig_label
from inventory.models import GPU, Node, NVLinkDomain

CARD_FIELDS = (
    "node_id",
    "index",
    "fabric_state",
    "fabric_status",
    "cluster_uuid",
    "clique_id",
    "domain_id",
    "fabric_degraded",
    "fabric_bandwidth",
    "fabric_health_summary",
    "fabric_problems",
    "health",
)
NODE_FIELDS = ("pk", "name", "state", "reachable", "imex_state", "imex_channels")


class _NodeRow(NamedTuple):
    """What the report reads of a node (:data:`NODE_FIELDS`), as a row."""

    pk: int
    name: str
    state: str
    reachable: bool
    imex_state: str
    imex_channels: list[int] | None


def nvlink_report() -> dict[str, Any]:
    """Every NVLink domain with its nodes; nodes trying to join none under ``unassigned``."""
    with cycles.uncollected():
        return _report()


def _report() -> dict[str, Any]:
    domains = {d.pk: d for d in NVLinkDomain.objects.all()}
    by_key = {k: pk for pk, d in domains.items() if (k := nvlink_rules.claimed_key(d.cluster_uuid, d.clique_id))}
    with_fabric = GPU.objects.filter(parent_index__isnull=True).exclude(fabric_state="")
    # Only the nodes with a card that could be in a domain or trying to join one are read: on a fleet
    # of HGX boxes nearly every card is settled alone (nvlink_rules.SETTLED_ALONE), and reading them
    # all was the whole of the report's time. A node read is read whole, and the rules decide as before.
    state, status, uuid = nvlink_rules.SETTLED_ALONE
    settled = Q(domain_id__isnull=True, fabric_state=state, fabric_status=status, cluster_uuid=uuid)
    candidates = with_fabric.exclude(settled).values("node_id")
    cards: dict[int, list[dict]] = defaultdict(list)
    for g in with_fabric.filter(node_id__in=candidates).values(*CARD_FIELDS):
        cards[g["node_id"]].append(g)
    members: dict[int | None, list[int]] = defaultdict(list)
    for node_id, node_cards in cards.items():
        home = _home(node_cards, by_key)
        if home is not None or any(_trying(c) for c in node_cards):
            members[home].append(node_id)
    member_ids = [i for ids in members.values() for i in ids]
    # Plain rows, not model instances: building 1,800 deferred Node instances was a fifth of the report.
    nodes = {n.pk: n for n in map(_NodeRow._make, Node.objects.filter(pk__in=member_ids).values_list(*NODE_FIELDS))}
    out = [
        _domain_view(d, [_node_view(nodes[i], cards[i], d.pk) for i in members.get(pk, [])])
        for pk, d in sorted(domains.items(), key=lambda kv: kv[1].name or kv[1].key)
    ]
    unassigned = [_node_view(nodes[i], cards[i], None) for i in members.get(None, [])]
    return {"domains": out, "unassigned": sorted(unassigned, key=lambda n: n["node"])}


def _claimed(card: dict, by_key: dict[nvlink_rules.DomainKey, int]) -> int | None:
    """The domain a card has joined, or the one its ClusterUUID and CliqueId name though it has not joined."""
    if card["domain_id"]:
        return card["domain_id"]
    key = nvlink_rules.claimed_key(card["cluster_uuid"], card["clique_id"])
    return None if key is None else by_key.get(key)


def _home(cards: list[dict], by_key: dict[nvlink_rules.DomainKey, int]) -> int | None:
    """The domain most of a node's cards belong with; by id on a tie, so the answer is stable."""
    counts: dict[int, int] = defaultdict(int)
    for c in cards:
        if (pk := _claimed(c, by_key)) is not None:
            counts[pk] += 1
    return min(counts, key=lambda pk: (-counts[pk], pk)) if counts else None


def _trying(card: dict) -> bool:
    """A card that has a multi-node fabric but is not (yet) in a domain: in progress, or failed."""
    return nvlink_rules.trying(card["fabric_state"], card["fabric_status"])


def _joined(card: dict, domain_pk: int | None) -> bool:
    return domain_pk is not None and card["domain_id"] == domain_pk


def _card_view(card: dict, domain_pk: int | None) -> dict[str, Any]:
    view: dict[str, Any] = {
        "index": card["index"],
        "label": mig_label(card["index"]),
        "joined": _joined(card, domain_pk),
        "fabric_state": card["fabric_state"],
        "degraded": bool(card["fabric_degraded"]),
        "healthy": not card["health"],
    }
    for key, field in (("fabric_status", "fabric_status"), ("bandwidth", "fabric_bandwidth")):
        if card[field]:
            view[key] = card[field]
    if card["fabric_health_summary"]:
        view["health_summary"] = card["fabric_health_summary"]
    if card["fabric_problems"]:
        view["problems"] = list(card["fabric_problems"])
    return view


def _card_reason(card: dict, domain_pk: int | None) -> str | None:
    """Why one card is not in the domain, in words; None when it is."""
    if _joined(card, domain_pk):
        return None
    label = mig_label(card["index"])
    state = (card["fabric_state"] or "").strip()
    if not nvlink_rules.completed(state):
        return f"gpu {label} fabric state {state}"
    status = (card["fabric_status"] or "").strip()
    if not nvlink_rules.registered(state, status):
        return f"gpu {label} fabric status {status or 'not reported'}"
    return f"gpu {label} joined another domain" if card["domain_id"] else f"gpu {label} joined no domain"


def _node_view(node: _NodeRow, cards: list[dict], domain_pk: int | None) -> dict[str, Any]:
    cards = sorted(cards, key=lambda c: c["index"])
    out = [r for c in cards if (r := _card_reason(c, domain_pk))]
    out += _imex_reasons(node)
    warnings = [
        f"gpu {mig_label(c['index'])} NVLink bandwidth degraded ({c['fabric_bandwidth'] or 'degraded'})"
        for c in cards
        if c["fabric_degraded"]
    ]
    warnings += [f"gpu {mig_label(c['index'])}: {c['health'][0]}" for c in cards if c["health"]]
    view: dict[str, Any] = {
        "node": node.name,
        "state": node.state,
        "reachable": node.reachable,
        "in_domain": domain_pk is not None and all(_joined(c, domain_pk) for c in cards),
        "ready": not out,
        "cards": [_card_view(c, domain_pk) for c in cards],
        "out": out,
        "warnings": warnings,
    }
    if node.imex_state:
        view["imex"] = node.imex_state
    if node.imex_channels is not None:
        view["imex_channels"] = node.imex_channels
    return view


def _imex_reasons(node: _NodeRow) -> list[str]:
    """IMEX must be up with a channel for memory to be shared across nodes; not reported is said as such."""
    state = (node.imex_state or "").strip().lower()
    if not state:
        return ["IMEX not reported by the agent"]
    if state != "up":
        return [f"IMEX {node.imex_state}"]
    if node.imex_channels is not None and not node.imex_channels:
        return ["IMEX is up but has no channel (create /dev/nvidia-caps-imex-channels/channel0)"]
    return []


def _domain_view(domain: NVLinkDomain, nodes: list[dict]) -> dict[str, Any]:
    nodes.sort(key=lambda n: n["node"])
    cards = [c for n in nodes for c in n["cards"]]
    view: dict[str, Any] = {
        "key": domain.key,
        "cluster_uuid": domain.cluster_uuid,
        "clique_id": domain.clique_id,
        "nodes_total": len(nodes),
        "nodes_in": sum(1 for n in nodes if n["in_domain"]),
        "nodes_ready": sum(1 for n in nodes if n["ready"]),
        "gpus_total": len(cards),
        "gpus_joined": sum(1 for c in cards if c["joined"]),
        "gpus_degraded": sum(1 for c in cards if c["degraded"]),
        "nodes": nodes,
    }
    if domain.name:
        view["name"] = domain.name
    return view
