"""How many replicas a model wants from its load: the autoscaler's decision, pure.

One call per model per reconcile: the fleet's load on the model (summed over
every gateway worker), the measured capacity of one replica, how many
replicas it has, and the history of earlier decisions (kept in the database,
since several control hosts reconcile) in; the desired count, the new
history and the reason in numbers out. No Django, no I/O.

The rule:

- **Need.** Enough replicas that the requests in flight plus those waiting
  stay under ``target_share`` (80 %) of one replica's measured concurrency
  each, and the tokens per second under the same share of its measured
  tokens per second; the larger of the two. A profile nobody measured gets
  ``default_concurrency`` (8), and the reason says it is a default.
- **Up quickly.** When the need stays above the current count for
  ``up_window_s`` (15 s), the count jumps to the need at once.
- **Down slowly.** When the load would fit on one replica fewer at
  ``down_share`` (60 %, below the target share: the band between the two is
  the hysteresis) for the cooldown — the model's idle timeout, else
  ``cooldown_s`` (300 s) — and the last change is as old, the count drops
  by one. The next step waits another cooldown.
- **Bounds.** Never above ``max``, never below ``min``. The autoscaler never
  takes a model that has a replica to zero (that stays the idle timeout's
  job) nor starts a model at zero before a request waits for it (that
  stays demand's: ``placement.writes.demand``), so a model at zero still
  starts on demand.
- **From what runs.** A decision starts from the count last wanted, or
  from the replicas running when more run, so it never stops more than one.
- **Replicas gone.** When fewer replicas remain than were wanted (stopped
  for idleness, failed, lost) and the load fits on those left, the count
  is taken down to them at once: this stops nothing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

UP, DOWN, HOLD = "up", "down", "hold"


@dataclass(frozen=True, slots=True)
class Policy:
    """The autoscaler's knobs (``LLMGW_AUTOSCALE_*``; see docs/operations.md)."""

    target_share: float = 0.8
    down_share: float = 0.6
    up_window_s: float = 15.0
    cooldown_s: float = 300.0
    default_concurrency: int = 8


@dataclass(frozen=True, slots=True)
class Capacity:
    """What one replica serves: measured (``PUT /api/v1/models/{name}/capacity``) or the default."""

    profile: str
    concurrency: int
    tokens_per_s: float | None = None
    measured: bool = False


@dataclass(frozen=True, slots=True)
class Load:
    """The fleet's load on one model, summed over the gateway workers that reported it.

    ``ttft_ms`` is the mean time to the first token of the requests that
    ended in the last window (None: none did); it is shown, not decided on.
    """

    in_flight: int = 0
    waiting: int = 0
    tokens_per_s: float = 0.0
    ttft_ms: float | None = None
    workers: int = 0

    @property
    def requests(self) -> int:
        return max(0, self.in_flight) + max(0, self.waiting)


@dataclass(frozen=True, slots=True)
class History:
    """The model's earlier decisions: the count wanted, when it last changed, since when it has been above or below."""

    desired: int | None = None
    changed_at: datetime | None = None
    above_since: datetime | None = None
    below_since: datetime | None = None


@dataclass(frozen=True, slots=True)
class Decision:
    desired: int
    history: History
    direction: str
    """``up`` or ``down`` when the count changed, ``hold`` when it did not."""
    reason: str
    need: int
    """Replicas the load needs at the target share, within [min, max]."""


def capacity_from(profile: str, measurement: Mapping[str, Any] | None, policy: Policy) -> Capacity:
    """One replica's capacity from a stored measurement; the policy's default when it has no usable concurrency.

    The measurement is the benchmark's JSON as it was sent: ``max_concurrency``
    (or ``concurrency``) and ``tokens_per_second``; anything not a positive
    number is left out.
    """
    m = measurement if isinstance(measurement, Mapping) else {}
    concurrency = _positive(m.get("max_concurrency", m.get("concurrency")))
    tps = _positive(m.get("tokens_per_second"))
    if concurrency is None:
        return Capacity(profile, policy.default_concurrency, tps, measured=False)
    return Capacity(profile, max(1, int(concurrency)), tps, measured=True)


def _positive(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        return None
    return float(value)


def bounds(min_replicas: int, max_replicas: int, live: int) -> tuple[int, int]:
    """The range the autoscaler moves in: [min, max], and not below one while the model has a replica."""
    high = max(0, min_replicas, max_replicas)
    low = max(0, min_replicas) if live <= 0 else max(1, min_replicas)
    return min(low, high), high


def needed(load: Load, capacity: Capacity, share: float) -> int:
    """Replicas that keep the load under ``share`` of each one's capacity (unbounded)."""
    by_requests = math.ceil(load.requests / (capacity.concurrency * share) - 1e-9) if load.requests else 0
    by_tokens = 0
    if capacity.tokens_per_s and load.tokens_per_s > 0:
        by_tokens = math.ceil(load.tokens_per_s / (capacity.tokens_per_s * share) - 1e-9)
    return max(by_requests, by_tokens)


def fits(load: Load, capacity: Capacity, replicas: int, share: float) -> bool:
    """Whether the load stays within ``share`` of ``replicas`` replicas' capacity (requests and tokens)."""
    if replicas <= 0:
        return load.requests == 0 and load.tokens_per_s <= 0
    if load.requests > replicas * capacity.concurrency * share:
        return False
    return not (capacity.tokens_per_s and load.tokens_per_s > replicas * capacity.tokens_per_s * share)


def decide(
    *,
    min_replicas: int,
    max_replicas: int,
    idle_timeout_s: float | None,
    live: int,
    load: Load,
    capacity: Capacity,
    history: History,
    now: datetime,
    policy: Policy = Policy(),
) -> Decision:
    """The count the model wants now, the history to keep, and why (see the module docstring)."""
    low, high = bounds(min_replicas, max_replicas, live)
    raw = needed(load, capacity, policy.target_share)
    need = _clamp(raw, low, high)
    # What was wanted, or what runs when more runs (started on demand, or before autoscaling).
    base = _clamp(live if history.desired is None or history.desired < live else history.desired, low, high)
    said = _Said(load, capacity, live, policy, raw, high)
    gone = ""
    if live < base and need <= live:
        gone = f" ({base} were wanted; {live} remain and the load fits on them)"
        base = _clamp(live, low, high)
        history = replace(history, desired=base, changed_at=now)
    if need > base:
        return _up(history, base, need, now, policy, said, gone)
    if base > low and fits(load, capacity, base - 1, policy.down_share):
        cooldown = idle_timeout_s if idle_timeout_s is not None else policy.cooldown_s
        return _down(history, base, need, now, cooldown, said, gone)
    kept = History(desired=base, changed_at=history.changed_at)
    return Decision(base, kept, HOLD, said.at_target(base) + gone, need)


def _up(history: History, base: int, need: int, now: datetime, policy: Policy, said: _Said, gone: str) -> Decision:
    since = history.above_since or now
    waited = (now - since).total_seconds()
    if waited >= policy.up_window_s:
        kept = History(desired=need, changed_at=now)
        why = said.at_target(need) + f"; up from {base} after {waited:.0f} s above it" + gone
        return Decision(need, kept, UP, why, need)
    left = policy.up_window_s - waited
    kept = History(desired=base, changed_at=history.changed_at, above_since=since)
    why = (
        said.at_target(need) + f"; up from {base} in {left:.0f} s if it stays "
        f"(window {policy.up_window_s:.0f} s)" + gone
    )
    return Decision(base, kept, HOLD, why, need)


def _down(history: History, base: int, need: int, now: datetime, cooldown: float, said: _Said, gone: str) -> Decision:
    since = history.below_since or now
    low_for = (now - since).total_seconds()
    unchanged_for = (now - history.changed_at).total_seconds() if history.changed_at else math.inf
    fewer = base - 1
    if low_for >= cooldown and unchanged_for >= cooldown:
        kept = History(desired=fewer, changed_at=now, below_since=now)
        why = said.fits_on(fewer) + f" for {low_for:.0f} s (cooldown {cooldown:.0f} s) → {fewer}" + gone
        return Decision(fewer, kept, DOWN, why, need)
    left = cooldown - min(low_for, unchanged_for)
    kept = History(desired=base, changed_at=history.changed_at, below_since=since)
    why = said.fits_on(fewer) + f"; down to {fewer} in {left:.0f} s if it stays (cooldown {cooldown:.0f} s)" + gone
    return Decision(base, kept, HOLD, why, need)


def _clamp(n: int, low: int, high: int) -> int:
    return max(low, min(high, n))


def _pct(share: float) -> str:
    return f"{share * 100:.0f} %"


@dataclass(frozen=True, slots=True)
class _Said:
    """The numbers every reason starts with: the load, the replicas, one replica's capacity."""

    load: Load
    capacity: Capacity
    live: int
    policy: Policy
    raw: int
    high: int

    def _load(self) -> str:
        parts = [f"in flight {self.load.in_flight}"]
        if self.load.waiting:
            parts.append(f"{self.load.waiting} waiting")
        if self.load.tokens_per_s > 0:
            parts.append(f"{self.load.tokens_per_s:.0f} tokens/s")
        replicas = "replica" if self.live == 1 else "replicas"
        return ", ".join(parts) + f" on {self.live} {replicas}"

    def _capacity(self) -> str:
        c = self.capacity
        text = f"capacity {c.concurrency} each"
        if c.tokens_per_s:
            text += f" and {c.tokens_per_s:.0f} tokens/s"
        if not c.measured:
            text += f" (a default: none measured for profile {c.profile})"
        return text

    def at_target(self, result: int) -> str:
        capped = f" (needs {self.raw}; capped at the maximum of {self.high})" if self.raw > self.high else ""
        return f"{self._load()}, {self._capacity()} at {_pct(self.policy.target_share)} → {result}{capped}"

    def fits_on(self, fewer: int) -> str:
        return f"{self._load()}, {self._capacity()}: fits on {fewer} at {_pct(self.policy.down_share)}"
