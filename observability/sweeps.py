"""Doctor sweeps: fleet-wide checks, kept as findings that open, stay, and resolve when they clear.

What a sweep looks for (kind: subject):

- ``domain_partly_joined``: an NVLink domain — some cards of its nodes, or
  cards that name it, have not joined it;
- ``imex_down``: a node — its cards are in (or name) a domain, but IMEX there is not up;
- ``domain_split_fabrics``: an NVLink domain — its nodes sit on two or more
  InfiniBand fabrics (inventory.fabrics.analyze + fabric_of);
- ``sm_changed``: a fabric (its declared name, else its physical key) — its
  master subnet manager changed (the analysis' SM problems: recently, or flapping);
- ``gpu_unhealthy``: ``<node>/gpu <label>`` — a card or MIG instance with health problems;
- ``gpu_memory_rising``: ``<node>/gpu <label>`` — a card whose memory error counters (aggregate
  ECC, remapped rows, retired pages) rose at its last change, within a day of it
  (inventory.health_rules.rising); a settled counter is no finding;
- ``gpu_held``: ``<node>/gpu <label>`` — card health holds the card (a fatal problem, not yet
  clean for the clean window): out of placement, its replicas moved (inventory.health_actions);
- ``node_health_cordoned``: a node — card health cordoned it after repeated problems;
- ``node_silent``: a node — unreachable past the grace, or lost;
- ``node_flapping``: a node — went silent and came back within the flap window
  (``inventory.reads.flaps``): it takes no new replica until the window passes
  or it is cordoned at ``LLMGW_FLAPS_TO_CORDON`` returns;
- ``model_parked``: a model — parked after failing every start;
- ``partition``: a group (the fleet, a fabric, ``rack=…``) — more than a share of
  its nodes went silent together; opened by the reachability sweep
  (``inventory.writes.partitions``) and kept here while its event is open, so
  this sweep neither resolves it early nor keeps it past its end.

How one sweep runs:

1. Load the fleet once into plain data (:func:`load`), in a fixed number of
   queries; of the fabric analysis the API and placement read
   (inventory.fabric_inventory), the part the rules use (``sm_inventory``).
2. Apply the rules (:func:`find`), pure functions of that data.
3. Record (:func:`record`), in one transaction: a finding not open yet is
   created; an open one gets its ``last_seen``, message and severity
   refreshed; an open one not found again is resolved. Running it twice
   changes nothing but ``last_seen``.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Q, QuerySet

from agent import nvlink_rules
from catalog.models import CatalogModel
from core import cycles
from core.jsonrows import values_decoded_once
from core.models import Finding, Severity
from inventory import fabrics, failure_rules, health_rules
from inventory.devices import mig_label
from inventory.fabric_inventory import sm_inventory
from inventory.loss_settings import loss_rules
from inventory.models import GPU, CardHold, Node, NVLinkDomain
from inventory.reachability import LossRules
from inventory.reads import flaps
from inventory.reads.partitions import active as active_partitions

WARNING, CRITICAL = Severity.WARNING.value, Severity.CRITICAL.value
MIG_EMPTY = "MIG enabled but no instances created"  # a carving matter, shown by doctor, not a sick card


@dataclass(frozen=True)
class Found:
    kind: str
    subject: str
    message: str
    severity: str = WARNING


@dataclass(frozen=True)
class NodeFact:
    name: str
    reachable: bool
    lost: bool
    unreachable_since: datetime | None
    imex_state: str  # "" when not reported


@dataclass(frozen=True)
class GpuFact:
    """``joined`` is the domain key the card has joined, ``claimed`` the one it names ("" for none)."""

    node: str
    index: int
    is_card: bool
    fabric_state: str
    joined: str | None
    claimed: str
    health: tuple[str, ...]
    memory: dict = field(default_factory=dict)  # ecc, remapped_rows, retired_pages (None: unknown)
    previous_memory: dict | None = None  # the same before their last change
    memory_changed_at: datetime | None = None

    @property
    def label(self) -> str:
        return mig_label(self.index)


@dataclass
class Fleet:
    nodes: dict[str, NodeFact] = field(default_factory=dict)
    gpus: list[GpuFact] = field(default_factory=list)  # load: the cards a rule can find something in (cards_to_read)
    domain_names: dict[str, str] = field(default_factory=dict)  # key -> a name for people
    # What split_fabrics and sm_changed read of the fabric analysis: load gives sm_report's part of it.
    fabric_report: fabrics.FabricReport | None = None
    parked: list[tuple[str, datetime, str]] = field(default_factory=list)
    partitions: list[dict] = field(default_factory=list)
    holds: list[tuple[str, int, datetime, str]] = field(default_factory=list)  # node, card, since, reason
    health_cordons: list[tuple[str, str]] = field(default_factory=list)  # node, reason
    flapping: dict[str, flaps.Flapper] = field(default_factory=dict)
    loss_rules: LossRules = field(default_factory=LossRules)


# --- loading (the only queries) -------------------------------------------------------------------------------------

# What a sweep reads of each card, in GpuFact's order.
GPU_FACTS = (
    "node__name",
    "index",
    "parent_index",
    "fabric_state",
    "domain_id",
    "cluster_uuid",
    "clique_id",
    "health",
    "ecc",
    "remapped_rows",
    "retired_pages",
    "previous_memory",
    "memory_changed_at",
)
GPU_FACTS_JSON = ("health", "ecc", "remapped_rows", "retired_pages", "previous_memory")


def cards_to_read(now: datetime) -> QuerySet:
    """The GPU rows a rule can find something in, in the order of all of them (by node name, then index).

    Every card of a node with a card that joined or may name an NVLink domain
    (the domain rules read all of such a node's cards), a card with any
    health word, and a card whose memory counters changed within the rising
    window of ``now``. The rest (at 10,000 nodes some 64,000 of 71,000 rows:
    healthy HGX cards, whose all-zero UUID names no domain) can give no
    finding, so reading them was most of a sweep for nothing. The conditions
    are wider than the rules, never narrower: a UUID of only zeros and dashes
    is the one kind that surely names no domain (nvlink_rules.cluster_uuid);
    tests/observability/test_sweep_rows.py holds the findings to those of every row.
    """
    window = timedelta(seconds=health_rules.RISING_WINDOW_S)
    in_domains = GPU.objects.filter(Q(domain__isnull=False) | ~Q(cluster_uuid__regex=r"^[0-]*$")).values("node_id")
    return GPU.objects.filter(
        Q(node_id__in=in_domains) | ~Q(health=[]) | Q(memory_changed_at__range=(now - window, now))
    )


def load(now: datetime) -> Fleet:
    # A row object for every GPU of the fleet, none in a cycle (core.cycles).
    with cycles.uncollected():
        return _load(now)


def _load(now: datetime) -> Fleet:
    fleet = Fleet()
    for name, reachable, lost, since, imex in Node.objects.values_list(
        "name", "reachable", "lost", "unreachable_since", "imex_state"
    ):
        fleet.nodes[name] = NodeFact(name, reachable, lost, since, imex)
    keys = {}
    for pk, uuid, clique, name in NVLinkDomain.objects.values_list("pk", "cluster_uuid", "clique_id", "name"):
        keys[pk] = f"{uuid}/{clique}"
        fleet.domain_names[keys[pk]] = name or keys[pk]
    # Each distinct JSON value decoded once: a healthy card's counters are every healthy card's (core.jsonrows).
    rows = values_decoded_once(cards_to_read(now), GPU_FACTS, GPU_FACTS_JSON)
    for node, index, parent, state, domain_id, uuid, clique, health, ecc, remap, retired, before, changed in (
        r.values() for r in rows
    ):
        fleet.gpus.append(
            GpuFact(
                node,
                index,
                parent is None,
                state,
                keys.get(domain_id),
                nvlink_rules.claimed_text(uuid, clique),
                tuple(health),
                {"ecc": ecc, "remapped_rows": remap, "retired_pages": retired},
                before,
                changed,
            )
        )
    # Of the fabric analysis the rules read each node's fabric and the SM problems: its part that reads only
    # them (inventory.fabrics.sm_report), where the whole analysis of every port was most of a large sweep.
    fleet.fabric_report = sm_inventory(now)
    fleet.holds = list(CardHold.objects.values_list("node__name", "gpu_index", "since", "reason"))
    fleet.health_cordons = list(Node.objects.exclude(health_cordon="").values_list("name", "health_cordon"))
    fleet.parked = list(
        CatalogModel.objects.filter(parked_at__isnull=False).values_list("name", "parked_at", "parked_error")
    )
    fleet.partitions = active_partitions()
    fleet.loss_rules = loss_rules()
    fleet.flapping = flaps.flapping(now, fleet.loss_rules.flap_window_s)
    return fleet


# --- the rules (pure) -----------------------------------------------------------------------------------------------


def _span(labels: list[str]) -> str:
    return f"gpu {labels[0]}" if len(labels) == 1 else "gpus " + ", ".join(labels)


def domain_members(fleet: Fleet) -> dict[str, set[str]]:
    """Domain key -> the nodes that have a card in it or naming it."""
    members: dict[str, set[str]] = defaultdict(set)
    for g in fleet.gpus:
        for key in {g.joined, g.claimed} - {None, ""}:
            members[key].add(g.node)
    return members


def partly_joined(fleet: Fleet) -> list[Found]:
    members = domain_members(fleet)
    cards_by_node: dict[str, list[GpuFact]] = defaultdict(list)
    for g in fleet.gpus:
        if g.is_card and nvlink_rules.has_fabric(g.fabric_state):
            cards_by_node[g.node].append(g)
    found = []
    for key, nodes in sorted(members.items()):
        cards = [g for n in sorted(nodes) for g in cards_by_node[n]]
        out = [g for g in cards if g.joined != key]
        if not out:
            continue
        per_node: dict[str, list[str]] = defaultdict(list)
        for g in out:
            per_node[g.node].append(g.label)
        where = "; ".join(f"{n}: {_span(labels)}" for n, labels in sorted(per_node.items()))
        name = fleet.domain_names.get(key, key)
        found.append(
            Found(
                "domain_partly_joined",
                key,
                f"NVLink domain {name}: {len(out)} of {len(cards)} cards have not joined ({where}). Those nodes take "
                "no multi-node replica of the domain; check nvidia-fabricmanager there and run llmgw doctor.",
            )
        )
    return found


def imex_down(fleet: Fleet) -> list[Found]:
    found = []
    for key, nodes in sorted(domain_members(fleet).items()):
        for name in sorted(nodes):
            node = fleet.nodes.get(name)
            # A silent node's IMEX state is from before it went quiet; node_silent speaks for it.
            if node is None or not node.reachable or node.imex_state == "up":
                continue
            state = node.imex_state or "not reported"
            found.append(
                Found(
                    "imex_down",
                    name,
                    f"IMEX is {state} on {name}, a node of NVLink domain {fleet.domain_names.get(key, key)}: "
                    "multi-node replicas cannot use it. Run llmgw doctor there (systemctl status nvidia-imex).",
                )
            )
    return _unique(found)


def split_fabrics(fleet: Fleet) -> list[Found]:
    report = fleet.fabric_report
    if report is None:
        return []
    found = []
    for key, nodes in sorted(domain_members(fleet).items()):
        on: dict[str, list[str]] = defaultdict(list)
        for n in sorted(nodes):
            physical = report.fabric_of(n)
            if physical is not None:
                on[physical].append(n)
        if len(on) < 2:
            continue
        spread = "; ".join(
            f"{_fabric_label(report, k)}: {len(ns)} node{'s' if len(ns) > 1 else ''} ({', '.join(ns[:3])}"
            f"{', …' if len(ns) > 3 else ''})"
            for k, ns in sorted(on.items(), key=lambda kv: -len(kv[1]))
        )
        found.append(
            Found(
                "domain_split_fabrics",
                key,
                f"The nodes of NVLink domain {fleet.domain_names.get(key, key)} sit on {len(on)} InfiniBand fabrics "
                f"({spread}): a replica reaching beyond the domain would mix them. Check the cabling.",
            )
        )
    return found


def _fabric_label(report: fabrics.FabricReport, key: str) -> str:
    physical = report.fabric(key)
    return physical.label if physical is not None else key


def sm_changed(fleet: Fleet, now: datetime) -> list[Found]:
    report = fleet.fabric_report
    if report is None:
        return []
    found = []
    for problem in report.problems:
        if problem.kind != "sm_flapping" or problem.physical is None:
            continue
        physical = report.fabric(problem.physical)
        changes = [e for e in (physical.sms if physical else []) if e.kind == "changed"]
        recent = [e for e in changes if timedelta(0) <= now - e.at <= fabrics.SM_FLAP_WINDOW]
        severity = CRITICAL if len(recent) >= fabrics.SM_FLAP_CHANGES else WARNING
        # The physical fabric's key is its master SM's GUID, which is what changes: name the finding after the
        # fabric's declared name where it has one, so a failover and its return are one finding, not two.
        found.append(Found("sm_changed", problem.fabric or problem.physical, problem.message, severity))
    return found


def unhealthy_gpus(fleet: Fleet) -> list[Found]:
    found = []
    for g in sorted(fleet.gpus, key=lambda g: (g.node, g.index)):
        problems = [p for p in g.health if p != MIG_EMPTY]
        if problems:
            found.append(
                Found(
                    "gpu_unhealthy",
                    f"{g.node}/gpu {g.label}",
                    f"gpu {g.label} on {g.node}: {'; '.join(problems)}. It takes no work until it reports healthy; "
                    "run llmgw doctor there.",
                )
            )
    return found


def memory_rising(fleet: Fleet, now: datetime) -> list[Found]:
    """Cards whose memory error counters rose at their last change, within health_rules.RISING_WINDOW_S of it."""
    window = timedelta(seconds=health_rules.RISING_WINDOW_S)
    found = []
    for g in sorted(fleet.gpus, key=lambda g: (g.node, g.index)):
        # A MIG instance carries its card's counters: the card's finding speaks for them.
        if not g.is_card or g.memory_changed_at is None or not timedelta(0) <= now - g.memory_changed_at <= window:
            continue
        rose = health_rules.rising(g.memory, g.previous_memory)
        if not rose:
            continue
        worst = health_rules.worst(rose)
        found.append(
            Found(
                "gpu_memory_rising",
                f"{g.node}/gpu {g.label}",
                f"gpu {g.label} on {g.node}: memory errors rising since {g.memory_changed_at:%Y-%m-%d %H:%M:%S %Z} "
                f"({'; '.join(p.message for p in rose)}). Watch it; drain the node if they keep rising.",
                CRITICAL if worst is not None and health_rules.is_fatal(worst) else WARNING,
            )
        )
    return found


def health_actions(fleet: Fleet) -> list[Found]:
    """What card health did and has not undone yet: held cards, cordoned nodes (inventory.health_actions)."""
    found = [
        Found(
            "gpu_held",
            f"{node}/gpu {mig_label(index)}",
            f"gpu {mig_label(index)} on {node} is held since {since:%Y-%m-%d %H:%M:%S %Z}: {reason}. It takes no "
            "work and its replicas are moved; it is released once clean for the clean window (LLMGW_HEALTH_CLEAN_S).",
            CRITICAL,
        )
        for node, index, since, reason in sorted(fleet.holds)
    ]
    found += [
        Found(
            "node_health_cordoned",
            node,
            f"{node} is cordoned by card health: {reason}. Uncordoned once clean for the clean window, "
            "or by an operator.",
            CRITICAL,
        )
        for node, reason in sorted(fleet.health_cordons)
    ]
    return found


def silent_nodes(fleet: Fleet) -> list[Found]:
    found = []
    for node in sorted(fleet.nodes.values(), key=lambda n: n.name):
        if node.reachable and not node.lost:
            continue
        since = f" since {node.unreachable_since:%Y-%m-%d %H:%M:%S %Z}" if node.unreachable_since else ""
        if node.lost:
            message = f"{node.name} is lost: silent{since}; what ran there is being placed elsewhere."
        else:
            message = f"{node.name} is unreachable: no heartbeat{since}. Is the agent running, and can it reach us?"
        found.append(Found("node_silent", node.name, message, CRITICAL if node.lost else WARNING))
    return found


def flapping_nodes(fleet: Fleet) -> list[Found]:
    """Each node that came back from a silence within the flap window, and what that does to it."""
    rules = fleet.loss_rules
    found = []
    for name in sorted(fleet.flapping):
        reason = failure_rules.flapping_reason(fleet.flapping[name].returns, rules.flap_window_s)
        if rules.flaps_to_cordon > 0:
            then = (
                f"it takes no new replica until the window passes, and is cordoned at {rules.flaps_to_cordon} "
                "returns (LLMGW_FLAPS_TO_CORDON)"
            )
        else:
            then = "flapping nodes are neither kept from new replicas nor cordoned (LLMGW_FLAPS_TO_CORDON=0)"
        found.append(
            Found(
                "node_flapping",
                name,
                f"{name} is {reason} (silences of partitions not counted): {then}. Its replicas are moved once.",
                WARNING,
            )
        )
    return found


def parked_models(fleet: Fleet) -> list[Found]:
    return [
        Found(
            "model_parked",
            name,
            f"{name} is parked since {at:%Y-%m-%d %H:%M:%S %Z} after failing every start"
            + (f": {error.strip().splitlines()[-1][:300]}" if error.strip() else "")
            + ". Fix the cause, then unpark it (or scale it).",
            CRITICAL,
        )
        for name, at, error in sorted(fleet.parked)
    ]


def partitioned_groups(fleet: Fleet) -> list[Found]:
    """Each open partition, in the words the reachability sweep opened it with."""
    return [
        Found(
            "partition",
            p["group"],
            failure_rules.partition_message(p["group"], p["nodes"], p["members"], p["since"], p.get("until")),
            CRITICAL,
        )
        for p in fleet.partitions
    ]


def _unique(found: list[Found]) -> list[Found]:
    """One finding per (kind, subject): a node of two domains is one IMEX problem."""
    seen: dict[tuple[str, str], Found] = {}
    for f in found:
        seen.setdefault((f.kind, f.subject), f)
    return list(seen.values())


def find(fleet: Fleet, now: datetime) -> list[Found]:
    return _unique(
        [
            *partly_joined(fleet),
            *imex_down(fleet),
            *split_fabrics(fleet),
            *sm_changed(fleet, now),
            *unhealthy_gpus(fleet),
            *memory_rising(fleet, now),
            *health_actions(fleet),
            *silent_nodes(fleet),
            *flapping_nodes(fleet),
            *parked_models(fleet),
            *partitioned_groups(fleet),
        ]
    )


# --- recording ------------------------------------------------------------------------------------------------------


@dataclass
class Recorded:
    opened: list[tuple[str, str]] = field(default_factory=list)
    resolved: list[tuple[str, str]] = field(default_factory=list)
    still_open: int = 0

    @property
    def changed(self) -> bool:
        return bool(self.opened or self.resolved)


@transaction.atomic
def record(found: list[Found], now: datetime) -> Recorded:
    """Open what is new, refresh what is still there, resolve what cleared (see the module docstring)."""
    result = Recorded()
    current = {(f.kind, f.subject): f for f in found}
    open_rows = {(r.kind, r.subject): r for r in Finding.objects.open().select_for_update()}
    Finding.objects.bulk_create(
        [
            Finding(
                kind=f.kind, subject=f.subject, message=f.message, severity=f.severity, first_seen=now, last_seen=now
            )
            for key, f in current.items()
            if key not in open_rows
        ]
    )
    result.opened = sorted(k for k in current if k not in open_rows)
    refreshed, reworded = [], []
    for key, row in open_rows.items():
        if key in current:
            refreshed.append(row.pk)
            if (row.message, row.severity) != (current[key].message, current[key].severity):
                row.message, row.severity = current[key].message, current[key].severity
                reworded.append(row)
    # One UPDATE for every refreshed row's last_seen, and a row by row CASE only for the few reworded:
    # rewriting thousands of unchanged findings that way was most of a large fleet's sweep.
    Finding.objects.filter(pk__in=refreshed).update(last_seen=now)
    Finding.objects.bulk_update(reworded, ["message", "severity"], batch_size=1000)
    gone = [row.pk for key, row in open_rows.items() if key not in current]
    Finding.objects.filter(pk__in=gone).update(resolved_at=now)
    result.resolved = sorted(k for k in open_rows if k not in current)
    result.still_open = len(refreshed)
    return result


def sweep(now: datetime) -> Recorded:
    return record(find(load(now), now), now)
