"""The autoscaler's decision on a simulated fleet: replicas over time against the ideal, for a ramp and a burst.

The decision is the real one (``placement.scheduling.autoscale.decide``),
taken every reconcile (5 s) with its history carried over as the database
would; the fleet is simulated: each replica serves ``--concurrency``
requests at once, each request takes ``--service-s``, a new replica is
ready ``--start-s`` after it is asked for, and a stopped one goes at once.
Clients are closed-loop: each sends its next request as soon as its last
ends. Requests beyond the ready replicas' slots wait in one queue, in
order; the waiting and in-flight counts are what the gateway workers would
report. Not the real gateway, agents or engines: the figures say what the
rule does, not what a fleet's network adds.

For each load shape it prints replicas over time (ideal: the replicas that
keep the clients under the target share, within [min, max]), then: the
replica-seconds used against the ideal's, the time from the load's first
rise to the first added replica being ready, the requests that waited and
their p99 wait, and the same run with autoscaling off (``min`` replicas)
as the baseline.

Then a cold start with the weights local against remote: a start is the
engine's load (``--start-s``) plus, on a node without the weights, their
fetch (``--weights-gb`` at ``--fetch-gbps``). The burst is run with each,
and the cold-start estimate (``placement.scheduling.coldstart``, fed the
starts the run measured) is printed for a node that holds the weights and one
that does not: what a waiting client would be told, and its Retry-After.

    python bench/autoscale.py                      # ramp 1 → 64 → 0, and a burst of 64
    python bench/autoscale.py --start-s 60 --cooldown-s 120
    python bench/autoscale.py --weights-gb 140 --fetch-gbps 0.5
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from placement.scheduling import coldstart
from placement.scheduling.autoscale import Capacity, History, Load, Policy, decide

T0 = datetime(2026, 12, 1, tzinfo=UTC)


def ramp(t: int) -> int:
    """1 → 64 clients over 120 s, 64 for 120 s, back to 0 over 120 s, then nothing for 600 s."""
    if t < 120:
        return 1 + t * 63 // 120
    if t < 240:
        return 64
    if t < 360:
        return 64 - (t - 240) * 64 // 120
    return 0


def burst(t: int) -> int:
    """Nothing... then 64 clients at once for 90 s, then 2 for the rest."""
    if t < 30:
        return 2
    if t < 120:
        return 64
    return 2


SHAPES = {"ramp": (ramp, 960), "burst": (burst, 720)}


@dataclass
class Run:
    series: list[tuple[int, int, int, int, int]] = field(default_factory=list)
    """(second, clients, ideal, desired, ready)."""
    waits: list[float] = field(default_factory=list)
    waited: int = 0
    done: int = 0
    replica_s: int = 0
    ideal_s: int = 0
    first_ready_s: float | None = None
    decisions: list[str] = field(default_factory=list)


def simulate(shape, seconds: int, args, autoscale: bool, start_s: float | None = None) -> Run:
    """One run; ``start_s`` replaces ``args.start_s`` (a start with a fetch in it)."""
    start_s = args.start_s if start_s is None else start_s
    policy = Policy(up_window_s=args.up_window_s, cooldown_s=args.cooldown_s)
    capacity = Capacity("sim", args.concurrency, measured=True)
    run = Run()
    history = History()
    desired = args.min
    ready = args.min
    starting: deque[float] = deque()  # when each replica being started is ready
    queue: deque[float] = deque()  # when each waiting request arrived
    serving: list[float] = []  # when each request in flight ends
    clients = 0
    rose_at = None
    for t in range(seconds):
        want = shape(t)
        # Clients that arrive send a request; clients that leave stop after their current one.
        for _ in range(max(0, want - clients)):
            queue.append(float(t))
        clients = want
        while starting and starting[0] <= t:
            starting.popleft()
            ready += 1
            if rose_at is not None and run.first_ready_s is None and ready > args.min:
                run.first_ready_s = t - rose_at
        ended = [e for e in serving if e <= t]
        serving = [e for e in serving if e > t]
        run.done += len(ended)
        # Each ended request's client sends its next, while the load still has that many clients.
        alive = len(serving) + len(queue)
        for _ in range(min(len(ended), max(0, clients - alive))):
            queue.append(float(t))
        while queue and len(serving) < ready * args.concurrency:
            arrived = queue.popleft()
            wait = t - arrived
            run.waits.append(wait)
            run.waited += wait > 0
            serving.append(t + args.service_s)
        if want > args.concurrency * policy.target_share * args.min and rose_at is None:
            rose_at = t
        if autoscale and t % 5 == 0:
            d = decide(
                min_replicas=args.min,
                max_replicas=args.max,
                idle_timeout_s=None,
                live=ready + len(starting),
                load=Load(in_flight=len(serving), waiting=len(queue)),
                capacity=capacity,
                history=history,
                now=T0 + timedelta(seconds=t),
                policy=policy,
            )
            if d.desired != desired:
                run.decisions.append(f"{t:>4} s: {desired} → {d.desired}: {d.reason}")
            history, desired = d.history, d.desired
            have = ready + len(starting)
            for _ in range(max(0, desired - have)):
                starting.append(t + start_s)
            for _ in range(max(0, have - desired)):
                if starting:
                    starting.pop()
                elif ready > 0:
                    ready -= 1
        ideal = max(args.min, min(args.max, math.ceil(want / (args.concurrency * policy.target_share))))
        run.replica_s += ready + len(starting)
        run.ideal_s += ideal
        run.series.append((t, want, ideal, desired, ready))
    return run


def p99(values: list[float]) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def report(name: str, on: Run, off: Run, every: int) -> None:
    print(f"\n== {name} ==")
    print(f"{'t (s)':>6} {'clients':>8} {'ideal':>6} {'desired':>8} {'ready':>6}")
    for t, clients, ideal, desired, ready in on.series[::every]:
        print(f"{t:>6} {clients:>8} {ideal:>6} {desired:>8} {ready:>6}")
    print("decisions:")
    for line in on.decisions:
        print("  " + line)
    first = f"{on.first_ready_s:.0f} s" if on.first_ready_s is not None else "never"
    print(
        f"autoscaling on : replica-seconds {on.replica_s} (ideal {on.ideal_s}, {on.replica_s / on.ideal_s:.2f}×); "
        f"load → first added replica ready {first}; requests {len(on.waits)}, waited {on.waited}, "
        f"p99 wait {p99(on.waits):.0f} s"
    )
    print(
        f"autoscaling off: replica-seconds {off.replica_s} ({off.replica_s / off.ideal_s:.2f}× the ideal); "
        f"requests {len(off.waits)}, waited {off.waited}, p99 wait {p99(off.waits):.0f} s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, default=16, help="requests one replica serves at once")
    parser.add_argument("--service-s", type=float, default=4.0, help="seconds one request takes")
    parser.add_argument("--start-s", type=float, default=30.0, help="seconds from asking for a replica to ready")
    parser.add_argument("--min", type=int, default=1)
    parser.add_argument("--max", type=int, default=8)
    parser.add_argument("--up-window-s", type=float, default=15.0)
    parser.add_argument("--cooldown-s", type=float, default=60.0)
    parser.add_argument("--every", type=int, default=30, help="print one row every this many seconds")
    parser.add_argument("--weights-gb", type=float, default=16.0, help="the weights' size, for a remote start")
    parser.add_argument("--fetch-gbps", type=float, default=0.5, help="the simulated fetch speed, GB/s")
    args = parser.parse_args()
    print(
        f"replica: {args.concurrency} at once, {args.service_s:g} s a request, ready {args.start_s:g} s after asked; "
        f"min {args.min}, max {args.max}; up window {args.up_window_s:g} s, cooldown {args.cooldown_s:g} s"
    )
    for name, (shape, seconds) in SHAPES.items():
        report(name, simulate(shape, seconds, args, True), simulate(shape, seconds, args, False), args.every)
    weights(args)


def weights(args) -> None:
    """The burst with every start on a warm disk, then with every start fetching the weights first."""
    fetch_s = args.weights_gb / args.fetch_gbps
    shape, seconds = SHAPES["burst"]
    print(f"\n== cold start: weights local against remote ({args.weights_gb:g} GB at {args.fetch_gbps:g} GB/s) ==")
    print(
        f"{'weights':>8} {'start s':>8} {'first added ready':>18} {'requests':>9} {'waited':>7} "
        f"{'p99 wait s':>11} {'wait s, all':>12}"
    )
    runs = {}
    for label, start in (("local", args.start_s), ("remote", args.start_s + fetch_s)):
        run = runs[label] = simulate(shape, seconds, args, True, start)
        first = f"{run.first_ready_s:.0f} s" if run.first_ready_s is not None else "never"
        print(
            f"{label:>8} {start:>8.0f} {first:>18} {len(run.waits):>9} {run.waited:>7} "
            f"{p99(run.waits):>11.0f} {sum(run.waits):>12.0f}"
        )
    local, remote = runs["local"], runs["remote"]
    print(
        f"remote/local: first added replica ready {remote.first_ready_s / local.first_ready_s:.2f}×, "
        f"time spent waiting {sum(remote.waits) / max(1.0, sum(local.waits)):.2f}×, "
        f"requests served {len(remote.waits) / max(1, len(local.waits)):.2f}×"
        if local.first_ready_s and remote.first_ready_s
        else "remote/local: no replica was added"
    )
    # The starts those runs made, as the agents would have timed them: three on node a (downloads), two on b.
    samples = [coldstart.Sample("a", fetch_s, args.start_s, False) for _ in range(3)]
    samples += [coldstart.Sample("b", 0.0, args.start_s * 1.2, True) for _ in range(2)]
    print("estimate (from 3 downloads on a, 2 local starts on b):")
    for node, holds in (("b", True), ("a", False), ("c", False)):
        est = coldstart.estimate(samples, node, holds)
        left = coldstart.remaining(est, coldstart.Progress("pending"))
        told = coldstart.describe("m", node, coldstart.Progress("pending"), left)
        print(f"  node {node}, {'holds' if holds else 'no'} weights: {est.total_s:.0f} s ({est.basis})")
        print(f"    told: {told}; Retry-After {math.ceil(left)}")


if __name__ == "__main__":
    main()
