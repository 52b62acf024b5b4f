"""What the fabric analysis reads and says: ports as reported, fabrics, problems, the SM's changes; fabric ids."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from typing import Any

from agent import protocol

# Changes of one master SM reported by many ports within this gap are one event:
# a failover is seen by every port of the fabric, each at its next report.
SM_EVENT_GAP = timedelta(minutes=5)
# Two or more changes of a fabric's master SM within this window is flapping.
SM_FLAP_WINDOW = timedelta(hours=1)
SM_FLAP_CHANGES = 2
# A single change stays on the report this long, so an operator sees it the next morning.
SM_RECENT = timedelta(hours=24)

# The error counters worth an operator's attention are agent.protocol's list (the
# agent keeps exactly those in a report's digest); here, the words a message uses
# for each. Left out of the list on purpose: data and packet counters (they rise
# with traffic), port_xmit_wait (congestion, not an error), VL15_dropped (subnet
# management packets dropped at start-up, harmless) and
# port_rcv_switch_relay_errors (documented by NVIDIA as inaccurate).
_COUNTER_WORDS = {
    "symbol_error": "symbol errors",
    "link_error_recovery": "link error recoveries",
    "link_downed": "link downs",
    "port_rcv_errors": "receive errors",
    "port_rcv_remote_physical_errors": "remote physical errors",
    "local_link_integrity_errors": "local link integrity errors",
    "excessive_buffer_overrun_errors": "buffer overruns",
    "port_xmit_discards": "transmit discards",
    "port_rcv_constraint_errors": "receive constraint errors",
    "port_xmit_constraint_errors": "transmit constraint errors",
}
# A counter added to the list without words fails here, at import.
ERROR_COUNTERS: dict[str, str] = {name: _COUNTER_WORDS[name] for name in protocol.ERROR_COUNTERS}

# perfquery spells the same counters differently; both spellings are accepted.
_PERFQUERY_NAMES = {
    "symbolerrorcounter": "symbol_error",
    "linkerrorrecoverycounter": "link_error_recovery",
    "linkdownedcounter": "link_downed",
    "portrcverrors": "port_rcv_errors",
    "portrcvremotephysicalerrors": "port_rcv_remote_physical_errors",
    "locallinkintegrityerrors": "local_link_integrity_errors",
    "excessivebufferoverrunerrors": "excessive_buffer_overrun_errors",
    "portxmitdiscards": "port_xmit_discards",
    "portrcvconstrainterrors": "port_rcv_constraint_errors",
    "portxmitconstrainterrors": "port_xmit_constraint_errors",
}

# What to do about each family of counters, in the order they matter.
_PHYSICAL = {
    "symbol_error",
    "link_error_recovery",
    "link_downed",
    "port_rcv_errors",
    "port_rcv_remote_physical_errors",
    "local_link_integrity_errors",
}
_CONGESTION = {"excessive_buffer_overrun_errors", "port_xmit_discards"}
_ADVICE_PHYSICAL = "a marginal cable or transceiver: reseat or replace it, and drain the node if they keep rising"
_ADVICE_CONGESTION = "packets dropped for lack of buffer: look for congestion or a stuck peer on that switch port"
_ADVICE_CONSTRAINT = "packets refused by partition or filtering rules: check the port's partition keys"

_KIND_ORDER = [
    "split_name",
    "merged_names",
    "split_node",
    "sm_unknown",
    "sm_flapping",
    "port_down",
    "slow_port",
    "errors_rising",
]


# --- input --------------------------------------------------------------------


@dataclass(frozen=True)
class PortFacts:
    """One InfiniBand or RoCE port as its node last reported it.

    Every optional field is None (or "") when the agent did not report it:
    ``state`` None is not "down", ``counters`` None is not "no errors".
    ``state`` and ``phys_state`` are taken as sysfs or ibstat print them
    ("4: ACTIVE", "Active", "5: LinkUp"). ``link_layer`` "Ethernet" makes the
    port RoCE, whose fabric is ``network`` (a CIDR); anything else is
    InfiniBand, whose fabric is ``sm_guid``. ``sm_error`` says why the SM
    could not be read. ``previous_counters`` are the counters of the report
    before, to see what rose since.
    """

    node: str
    hca: str
    port: int
    state: str | None = None
    phys_state: str | None = None
    rate_gbps: float | None = None
    link_layer: str | None = None
    node_guid: str | None = None
    port_guid: str | None = None
    sm_lid: int | None = None
    sm_guid: str | None = None
    sm_error: str | None = None
    network: str | None = None
    declared_fabric: str | None = None
    counters: Mapping[str, Any] | None = None
    previous_counters: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class SMChange:
    """The master SM a port sees changed from ``old`` to ``new`` at ``at``; None: no SM (lost, or not yet found)."""

    node: str
    hca: str
    port: int
    old: str | None
    new: str | None
    at: datetime


# --- output -------------------------------------------------------------------


@dataclass(frozen=True, order=True)
class PortRef:
    node: str
    hca: str
    port: int

    def __str__(self) -> str:
        return f"{self.node} {self.hca} port {self.port}"


@dataclass
class SMEvent:
    """One change of a fabric's master SM, as many ports reported it.

    ``kind`` is "changed" (a failover, a lost or regained SM) or "moved" (the
    ports went from one live fabric's SM to another's: recabling, not the SM).
    """

    at: datetime
    old: str | None
    new: str | None
    kind: str
    ports: int
    nodes: list[str]
    last_at: datetime


@dataclass
class PhysicalFabric:
    """One physical fabric: an SM for InfiniBand, a network for RoCE.

    ``declared`` are the names its nodes gave it, the most used first (empty:
    no node named it). ``sm_lid`` is the LID most of its ports reach the SM
    at. ``rate_gbps`` is its ports' common rate, None when none reported one.
    ``sms`` is the master SM's history, oldest first.
    """

    key: str
    label: str
    kind: str  # "infiniband" or "roce"
    declared: list[str]
    nodes: list[str]
    ports: list[PortRef]
    sm_guid: str | None = None
    sm_lid: int | None = None
    network: str | None = None
    rate_gbps: float | None = None
    sms: list[SMEvent] = field(default_factory=list)

    @property
    def id(self) -> str:
        return fabric_id(self.key)


@dataclass
class Problem:
    """Something an operator should act on, in one sentence (``message``).

    ``fabric`` is the declared name it concerns and ``physical`` the physical
    fabric's key; ``node``/``hca``/``port`` the node or port, when it is about
    one. Each is None when the problem is not about such a thing.
    """

    kind: str
    message: str
    fabric: str | None = None
    physical: str | None = None
    node: str | None = None
    hca: str | None = None
    port: int | None = None


@dataclass
class FabricReport:
    """The physical fabrics, the problems found, and for placement the fabric of each node."""

    physical: list[PhysicalFabric]
    problems: list[Problem]
    node_fabrics: dict[str, list[str]]
    node_reasons: dict[str, str]

    def fabric_of(self, node: str) -> str | None:
        """The one physical fabric key the node's live ports are all on.

        None when that is not known for sure: the node has no port up, a port
        whose SM could not be read, or ports on two physical fabrics (a
        multi-node replica on it could reach peers through the wrong one).
        ``why_no_fabric`` says which.
        """
        return None if node in self.node_reasons else next(iter(self.node_fabrics.get(node, [])), None)

    def why_no_fabric(self, node: str) -> str | None:
        """Why ``fabric_of(node)`` is None, as a clause placement can put in its refusal; None when it is not None."""
        if node in self.node_reasons:
            return self.node_reasons[node]
        if not self.node_fabrics.get(node):
            return f"{node} reported no InfiniBand or RoCE port"
        return None

    def fabric(self, key: str) -> PhysicalFabric | None:
        return next((p for p in self.physical if p.key == key or p.id == key), None)

    def problems_for(self, *, node: str | None = None, physical: str | None = None) -> list[Problem]:
        return [
            p
            for p in self.problems
            if (node is None or p.node == node) and (physical is None or p.physical == physical)
        ]

    def as_json(self) -> dict[str, Any]:
        """Plain data for an API: dicts, lists, strings, numbers; times in ISO 8601."""
        return _jsonable(
            {
                "physical": [{**asdict(p), "id": p.id} for p in self.physical],
                "problems": [asdict(p) for p in self.problems],
                "nodes": {
                    n: {"fabric": self.fabric_of(n), "why_not": self.why_no_fabric(n)} for n in self.node_fabrics
                },
            }
        )


def fabric_id(key: str) -> str:
    """A physical fabric's key as a URL path segment can carry it.

    "sm:0x…" becomes "sm-0x…" and "roce:10.0.0.0/24" becomes "roce-10.0.0.0_24".
    """
    return re.sub(r"[^A-Za-z0-9._~-]", "_", key.replace(":", "-").replace("/", "_"))


def describe_key(key: str, sm_lid: int | None = None) -> str:
    """A physical fabric in words: "SM 0x… (LID 1)", "RoCE 10.0.0.0/24"."""
    kind, _, ident = key.partition(":")
    if kind == "roce":
        return f"RoCE {ident}"
    return f"SM {ident} (LID {sm_lid})" if sm_lid is not None else f"SM {ident}"


@dataclass
class _Port:
    """A port with what the analysis derives from it."""

    facts: PortFacts
    ref: PortRef
    live: bool  # not known to be down
    key: str | None  # its physical fabric; None when unknown
    declared: str | None


def _who(p: _Port) -> str:
    return str(p.ref)


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    return value
