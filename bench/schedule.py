"""How long the scheduler takes on a big fleet: plan from empty, re-plan with nothing changed.

The fleet is synthetic but shaped like the real thing: 40 GB200 NVL72 racks
(18 trays × 4 GPUs, one domain each, a few trays not joined or with IMEX
down), 3,800 HGX H100 boxes on two InfiniBand fabrics, 400 A100 boxes with
half their cards in MIG mode, CPU nodes — 5,000 nodes, about 40,000 GPUs —
and 1,000 models asking for somewhat more than the fleet has, so the plan
also explains what it could not place.

    python bench/schedule.py [--seed N] [--repeat N]

Prints figures; it is not a timed test.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from placement.scheduler import (
    GpuInfo,
    ModelInfo,
    NodeInfo,
    Plan,
    ProfileSpec,
    ReplicaInfo,
    ShardInfo,
    Snapshot,
    plan,
)
from placement.scheduling import what_if as W

NOW = datetime(2026, 10, 5, 12, 0, tzinfo=UTC)
ENGINES = frozenset({"vllm", "sglang", "llamacpp"})


def node_state(rng: random.Random) -> str:
    roll = rng.random()
    return "cordoned" if roll < 0.02 else "draining" if roll < 0.03 else "ready"


def hgx(name: str, fabric: str, rng: random.Random) -> NodeInfo:
    gpus = tuple(
        GpuInfo(
            index=i,
            gpu_class="h100-80g",
            uuid=f"GPU-{name}-{i}",
            healthy=rng.random() > 0.01,
            problems=("Xid 79",),
            numa=i // 4,
            nvlink_peers=frozenset(range(8)) - {i},
            fabric_state="Completed",
            fabric_status="Success",
        )
        for i in range(8)
    )
    return NodeInfo(
        name=name, state=node_state(rng), labels={}, engines=ENGINES, memory_mb=2 << 20, fabric=fabric, gpus=gpus
    )


def nvl72(rack: int, rng: random.Random) -> list[NodeInfo]:
    domain = f"{rack:08x}-0000-4000-8000-000000000000/32766"
    fabric = "ib-gb-a" if rack % 2 else "ib-gb-b"
    lagging = rng.randrange(18) if rack % 5 == 0 else None
    imex_down = rng.randrange(18) if rack % 7 == 0 else None
    nodes = []
    for t in range(18):
        gpus = []
        for i in range(4):
            joining = t == lagging and i == 3
            gpus.append(
                GpuInfo(
                    index=i,
                    gpu_class="gb200-186g",
                    numa=i // 2,
                    nvlink_peers=frozenset(range(4)) - {i},
                    fabric_state="In Progress" if joining else "Completed",
                    fabric_status="N/A" if joining else "Success",
                    domain=None if joining else domain,
                )
            )
        nodes.append(
            NodeInfo(
                name=f"nvl72-{rack:02d}-tray{t:02d}",
                state="ready",
                engines=ENGINES,
                memory_mb=880 << 10,
                imex_state="down" if t == imex_down else "up",
                imex_channels=1,
                fabric=fabric,
                gpus=tuple(gpus),
            )
        )
    return nodes


def a100_mig(name: str, rng: random.Random) -> NodeInfo:
    gpus = []
    for card in range(8):
        mig = card >= 4
        gpus.append(GpuInfo(index=card, gpu_class="a100-80g", numa=card // 4, mig_mode=mig))
        if mig:
            for n in range(2):
                gpus.append(
                    GpuInfo(
                        index=1000 + 100 * card + n,
                        gpu_class="a100-80g-mig-3g.40gb",
                        parent=card,
                        mig_uuid=f"MIG-{name}-{card}-{n}",
                        numa=card // 4,
                    )
                )
    return NodeInfo(name=name, state=node_state(rng), engines=ENGINES, memory_mb=1 << 20, gpus=tuple(gpus))


def fleet(rng: random.Random) -> list[NodeInfo]:
    nodes: list[NodeInfo] = []
    for rack in range(40):
        nodes += nvl72(rack, rng)
    nodes += [hgx(f"h100-{i:04d}", "ib-east" if i < 1900 else "ib-west", rng) for i in range(3800)]
    nodes += [a100_mig(f"a100-{i:03d}", rng) for i in range(400)]
    nodes += [NodeInfo(name=f"cpu-{i:02d}", engines=ENGINES, memory_mb=512 << 10) for i in range(80)]
    return nodes


def profile(name: str, gpu_class: str, gpus: int = 1, nodes: int = 1, memory_gb: float | None = None) -> ProfileSpec:
    engine = "llamacpp" if gpu_class == "cpu" else "vllm"
    return ProfileSpec(
        name=name,
        engine=engine,
        gpu_class=gpu_class,
        gpus=gpus,
        nodes=nodes,
        tp=max(gpus, 1) * nodes,
        memory_gb=memory_gb,
        fingerprint=f"{name}-fp",
    )


def catalog(rng: random.Random) -> list[ModelInfo]:
    """1,000 models; between them they ask for somewhat more than the fleet has."""
    kinds = [("small", 480), ("large", 200), ("ib", 60), ("nvl", 60), ("tray", 60), ("mig", 100), ("cpu", 40)]
    models = []
    for kind, count in kinds:
        for i in range(count):
            low = {"small": rng.randint(1, 24), "large": rng.randint(1, 14), "ib": rng.randint(1, 20)}.get(
                kind, rng.randint(1, 4)
            )
            models.append(
                ModelInfo(
                    name=f"{kind}-{i:03d}",
                    profiles=_profiles(kind, rng),
                    min_replicas=low,
                    max_replicas=low + 3,
                    wanted=low + rng.randint(0, 3) if rng.random() < 0.3 else None,
                    idle_timeout_s=1800.0,
                    parked_error="CUDA error: out of memory" if rng.random() < 0.01 else None,
                )
            )
    return models


def _profiles(kind: str, rng: random.Random) -> tuple[ProfileSpec, ...]:
    if kind == "small":
        return (profile("h100", "h100-80g", rng.choice([1, 1, 2])), profile("mig", "a100-80g-mig-3g.40gb"))
    if kind == "large":
        return (profile("h100", "h100-80g", rng.choice([4, 8])), profile("a100", "a100-80g", 4))
    if kind == "ib":
        return (profile("h100x2", "h100-80g", 8, nodes=2),)
    if kind == "nvl":
        return (profile("nvl", "gb200-186g", 4, nodes=rng.choice([2, 4, 8, 18])),)
    if kind == "tray":
        return (profile("tray", "gb200-186g", rng.choice([1, 2, 4])),)
    if kind == "mig":
        return (profile("mig", "a100-80g-mig-3g.40gb"),)
    return (profile("cpu", "cpu", 0, memory_gb=rng.choice([32, 64, 128])),)


def as_running(p: Plan) -> list[ReplicaInfo]:
    """The plan's new replicas as the next snapshot will see them: ready, just used."""
    return [
        ReplicaInfo(
            id=f"r{i:06d}",
            model=new.model,
            profile=new.profile,
            fingerprint=new.fingerprint,
            state="ready",
            shards=tuple(ShardInfo(node=s.node, rank=s.rank, gpus=s.gpus) for s in new.shards),
            created_at=NOW - timedelta(minutes=5),
            last_used_at=NOW - timedelta(seconds=30),
        )
        for i, new in enumerate(p.create)
    ]


def timed(snapshot: Snapshot, repeat: int) -> tuple[float, Plan]:
    best, result = float("inf"), None
    for _ in range(repeat):
        start = time.perf_counter()
        result = plan(snapshot)
        best = min(best, time.perf_counter() - start)
    assert result is not None
    return best, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=3, help="runs per figure; the best is printed")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    nodes, models = fleet(rng), catalog(rng)
    gpus = sum(len(n.gpus) for n in nodes)
    cards = sum(1 for n in nodes for g in n.gpus if g.parent is None)
    print(f"fleet: {len(nodes)} nodes, {gpus} GPUs ({cards} cards, {gpus - cards} MIG instances); {len(models)} models")

    empty = Snapshot(nodes=tuple(nodes), models=tuple(models), replicas=(), now=NOW)
    took, first = timed(empty, args.repeat)
    shards = sum(len(r.shards) for r in first.create)
    used = sum(len(s.gpus) for r in first.create for s in r.shards)
    lines = sum(len(v) for v in first.rejections.values())
    print(f"plan from empty:       {took:6.3f} s  {len(first.create)} replicas, {shards} shards, {used} GPUs")
    print(f"  placements/s:        {len(first.create) / took:8.0f}")
    print(f"  unplaceable models:  {len(first.unplaceable)}, parked: {len(first.parked)}, rejection lines: {lines}")

    again = replace(empty, replicas=tuple(as_running(first)))
    took2, second = timed(again, args.repeat)
    print(f"re-plan, no change:    {took2:6.3f} s  {len(second.create)} new replicas, {len(second.stop)} stops")
    print(f"  deterministic:       {plan(empty) == first}")
    what_if_figures(again)
    for prefix in ("nvl-", "tray-", "small-", "ib-", "mig-"):
        name = next((m for m in first.unplaceable if m.startswith(prefix)), None)
        if name is None:
            continue
        print(f"  why {name} is short:")
        for r in first.rejections[name][:8]:
            print(f"    [{r.profile}] {r.node + ': ' if r.node else ''}{r.reason}")


def what_if_figures(placed: Snapshot) -> None:
    """The what-if on the placed fleet: one rack lost, one tray, one InfiniBand fabric (two plans each)."""
    domains = sorted({g.domain for n in placed.nodes for g in n.gpus if g.domain})
    fabrics = sorted({n.fabric for n in placed.nodes if n.fabric})
    busiest = max(placed.replicas, key=lambda r: len(r.shards)).shards[0].node
    for text in (domains[0], busiest, fabrics[0]):
        start = time.perf_counter()
        targets = W.resolve([text], placed)
        answer = W.what_if(placed, targets, moves_per_minute=10)
        took = time.perf_counter() - start
        print(
            f"what-if lose {targets[0].kind} ({len(answer.lost)} node{'s' * (len(answer.lost) != 1)}): {took:6.3f} s  "
            f"{len(answer.moves)} stop, {answer.placed} placed in {answer.move_minutes} min, {len(answer.short)} short"
        )


if __name__ == "__main__":
    main()
