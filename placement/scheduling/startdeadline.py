"""How long a replica may take to become ready before the control plane gives up on it: pure.

The agent times out an engine that never answers its probe, but only the
engine's load, and only if the agent is honest and alive. A replica whose
node never reports it ready (a hostile or wedged agent, a download that
hangs, an agent that never picks the shard up) would otherwise stay
``pending`` or ``starting`` for ever: counted as the model's replica, so
nothing replaces it, and never ``ready``, so the idle timeout never stops it.
The reconciler fails such a replica once it is past its deadline, counting
from when it was placed, and the plan places another
(placement/writes/startdeadlines.py).

The deadline follows what the start has to do, node by node:

- **Fetch.** Nothing when the node holds the weights. Otherwise the model's
  size over the node's measured download rate (the median of its earlier
  downloads, any model's: a node's network does not depend on what it
  fetches), else over the fleet's median rate; with no size or no rate
  known, the median of the model's measured downloads, else the default
  fetch the cold-start estimate assumes.
- **Load.** The cold-start estimate's load (placement.scheduling.coldstart):
  the median of the model's measured loads, else its default.
- **The deadline** is ``slack`` times the slowest node's fetch plus the
  load, never below ``floor_s`` (a wedged agent is caught within that) and
  never above ``cap_s`` (a size or rate measured absurdly cannot keep a
  replica starting for days).

No Django, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from statistics import median

# The agent's own engine start timeout (agent/supervisor/supervisor.py): the control plane never
# gives up on a start sooner than the agent itself would.
FLOOR_S = 1800.0
CAP_S = 6 * 3600.0
SLACK = 3.0


@dataclass(frozen=True, slots=True)
class Policy:
    """The deadline's knobs (LLMGW_START_DEADLINE_FLOOR_S, _CAP_S, _SLACK; docs/operations.md)."""

    floor_s: float = FLOOR_S
    cap_s: float = CAP_S
    slack: float = SLACK


@dataclass(frozen=True, slots=True)
class NodeFetch:
    """What is known of the fetch one node of the replica has to make."""

    node: str
    holds_weights: bool = False
    rate_bps: float | None = None
    """The node's measured download rate in bytes per second; None: it never downloaded anything measured."""


@dataclass(frozen=True, slots=True)
class Known:
    """What is known of the model, whatever the node."""

    size_bytes: int | None = None
    """The weights' size, from a download or prefetch that said; None: never said."""
    fleet_rate_bps: float | None = None
    """The median download rate over every node's measured downloads; None: none measured."""
    measured_fetch_s: float | None = None
    """The median of the model's measured downloads in seconds; None: none measured."""
    default_fetch_s: float = 120.0
    load_s: float = 60.0
    load_basis: str = "the default"


@dataclass(frozen=True, slots=True)
class Deadline:
    seconds: float
    basis: str
    """How it was reached, in a sentence an operator can check."""


def rate(samples: Iterable[tuple[int, float]]) -> float | None:
    """The median rate in bytes per second of downloads given as (bytes, seconds); None with none usable."""
    rates = [b / s for b, s in samples if b > 0 and s > 0]
    return float(median(rates)) if rates else None


def _gb(n: float) -> str:
    return f"{n / 1e9:.1f} GB"


def _mbps(bps: float) -> str:
    return f"{bps / 1e6:.1f} MB/s"


def fetch_seconds(node: NodeFetch, known: Known) -> tuple[float, str]:
    """The seconds ``node``'s fetch should take, and why."""
    if node.holds_weights:
        return 0.0, f"{node.node} holds the weights"
    size = known.size_bytes
    if size and node.rate_bps:
        return size / node.rate_bps, f"{_gb(size)} at {_mbps(node.rate_bps)} measured on {node.node}"
    if size and known.fleet_rate_bps:
        rate_ = known.fleet_rate_bps
        return size / rate_, f"{_gb(size)} at {_mbps(rate_)}, the fleet's median ({node.node} never measured)"
    if known.measured_fetch_s is not None:
        return known.measured_fetch_s, f"{known.measured_fetch_s:.0f} s, the median of the model's measured downloads"
    return known.default_fetch_s, f"the default {known.default_fetch_s:.0f} s (no size and rate known)"


def deadline(nodes: Sequence[NodeFetch], known: Known, policy: Policy = Policy()) -> Deadline:
    """The replica's deadline from its nodes' fetches (the slowest counts) and the model's load."""
    fetches = [fetch_seconds(n, known) for n in nodes] or [fetch_seconds(NodeFetch("any node"), known)]
    fetch_s, fetch_why = max(fetches, key=lambda f: f[0])
    expected = fetch_s + known.load_s
    raw = policy.slack * expected
    seconds = min(policy.cap_s, max(policy.floor_s, raw))
    why = (
        f"{policy.slack:g} × (fetch {fetch_s:.0f} s: {fetch_why}; load {known.load_s:.0f} s: {known.load_basis})"
        f" = {raw:.0f} s"
    )
    if seconds > raw:
        why += f", raised to the floor of {policy.floor_s:.0f} s"
    elif seconds < raw:
        why += f", cut to the cap of {policy.cap_s:.0f} s"
    return Deadline(seconds, why)


def overdue(placed_at: datetime, now: datetime, limit: Deadline) -> bool:
    """Whether a replica placed at ``placed_at`` and still not ready at ``now`` is past ``limit``."""
    return (now - placed_at).total_seconds() > limit.seconds


def sentence(replica: str, nodes: Sequence[str], waited_s: float, limit: Deadline) -> str:
    """What the reconciler says of a replica it failed for its deadline (its error, the explanation, the audit)."""
    where = ", ".join(nodes) or "no node"
    return (
        f"replica {replica} on {where} was not ready {waited_s:.0f} s after it was placed, past its start "
        f"deadline of {limit.seconds:.0f} s ({limit.basis}); failed by the control plane, so that another is placed"
    )
