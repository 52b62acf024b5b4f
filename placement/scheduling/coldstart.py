"""How long a model's next cold start will take, from the starts measured before it.

Pure: measured starts in, an estimate with the reason for it out. The
gateway tells a waiting client this estimate (an SSE comment while it waits,
``Retry-After`` when it gives up) and ``ctl replicas`` shows it.

A start has two phases worth estimating (the agent times them,
agent/supervisor/supervisor.py): the fetch of the weights onto the node and
the engine's load up to its first answer. Each is the median of recent
measurements of the same model and profile, so that one slow start does not
move the estimate much:

- the engine load: the node's own starts when it has any (its disk, its
  cards), else every node's;
- the fetch: nothing when the node already holds the weights; else the
  node's own fetches that downloaded, else every node's, else the default;
- nothing measured at all: the defaults, and the reason says so.

While a start is under way, :func:`remaining` subtracts what has been done
from the estimate, and a download whose size is known is extrapolated from
its own speed instead.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

DEFAULT_LOAD_S = 60.0
DEFAULT_FETCH_S = 120.0
# A phase already longer than its estimate is not about to end: the client is told a little more.
OVERDUE_S = 10.0


@dataclass(frozen=True)
class Sample:
    """One measured start (a placement.models.ColdStart row)."""

    node: str
    fetch_s: float
    load_s: float
    weights_local: bool


@dataclass(frozen=True)
class Estimate:
    fetch_s: float
    load_s: float
    basis: str
    """What the figures come from, in a sentence."""
    measured: bool
    """True only when every phase counted is measured: with a default in it (nothing measured for
    this model and profile, or no download measured where one is needed) it is False."""

    @property
    def total_s(self) -> float:
        return self.fetch_s + self.load_s


def _median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def estimate(
    samples: Sequence[Sample],
    node: str | None,
    holds_weights: bool,
    *,
    default_load_s: float = DEFAULT_LOAD_S,
    default_fetch_s: float = DEFAULT_FETCH_S,
) -> Estimate:
    """The estimated start of a shard on ``node`` (None: not placed yet) from ``samples``, newest first."""
    if not samples:
        fetch = 0.0 if holds_weights else default_fetch_s
        why = "no start of this model and profile measured yet: the defaults"
        why += ", and no fetch (the node holds the weights)" if holds_weights else ""
        return Estimate(fetch, default_load_s, why, False)
    here = [s for s in samples if node is not None and s.node == node]
    loads = here or samples
    parts = [f"load: median of {len(loads)} start(s) {'on ' + node if here else 'on any node'}"]
    measured = True
    if holds_weights:
        fetch = 0.0
        parts.append("no fetch (the node holds the weights)")
    else:
        fetched_here = [s.fetch_s for s in here if not s.weights_local]
        fetched = fetched_here or [s.fetch_s for s in samples if not s.weights_local]
        if fetched:
            fetch = _median(fetched)
            where = "on " + str(node) if fetched_here else "on any node"
            parts.append(f"fetch: median of {len(fetched)} download(s) {where}")
        else:
            fetch, measured = default_fetch_s, False
            parts.append("fetch: the default (no download measured)")
    return Estimate(fetch, _median([s.load_s for s in loads]), "; ".join(parts), measured)


@dataclass(frozen=True)
class Progress:
    """Where a start stands: the shard's state and the phases so far (its agent's last report)."""

    state: str
    """pending (not picked up yet), fetching, starting (the engine loads) or ready."""
    fetch_s: float = 0.0
    load_s: float = 0.0
    bytes_done: int | None = None
    bytes_total: int | None = None


def remaining(est: Estimate, progress: Progress) -> float:
    """Seconds the start still needs by ``est``, given ``progress``; 0 once ready.

    Never more than the whole estimate plus ``OVERDUE_S``, never less than 1 s
    while not ready; a phase past its estimate counts as ``OVERDUE_S`` more.
    """
    if progress.state == "ready":
        return 0.0
    if progress.state == "starting":
        left = est.load_s - progress.load_s
        return max(1.0, left if left > 0 else OVERDUE_S)
    if progress.state == "fetching":
        done, total = progress.bytes_done, progress.bytes_total
        if done and total and total > done and progress.fetch_s > 0:
            # The download's own speed beats any history: the network is what it is today.
            fetch_left = progress.fetch_s * (total - done) / done
        else:
            fetch_left = est.fetch_s - progress.fetch_s
            fetch_left = fetch_left if fetch_left > 0 else OVERDUE_S
        return max(1.0, fetch_left + est.load_s)
    return max(1.0, est.total_s)


def describe(model: str, node: str | None, progress: Progress, left: float) -> str:
    """Where the start stands, in words a client reads: what it waits for, on which node, how long still."""
    where = f"on {node}" if node else "(not placed on a node yet)"
    if progress.state == "fetching":
        if progress.bytes_done is not None and progress.bytes_total:
            gb = f" ({progress.bytes_done / 1e9:.1f} of {progress.bytes_total / 1e9:.1f} GB)"
        elif progress.bytes_done is not None:
            gb = f" ({progress.bytes_done / 1e9:.1f} GB so far)"
        else:
            gb = ""
        doing = f"fetching the weights{gb}"
    elif progress.state == "starting":
        doing = "loading the engine"
    elif progress.state == "ready":
        return f"{model}: a replica is ready {where}"
    else:
        doing = "waiting for its agent to pick it up"
    return f"{model}: replica starting {where}, {doing}, about {left:.0f} s left"
