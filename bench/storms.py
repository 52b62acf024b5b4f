"""Failure storms on a simulated fleet: how many replicas move, how fast, what is found, and when all is placed again.

Builds a fresh PostgreSQL database (``llmgw_bench_storms``), stores NODES simulated HGX nodes through the real
ingestion, labelled ``rack`` in racks of RACK nodes, on two InfiniBand fabrics (``north`` 60 %, ``south``
40 %), and places models filling about two thirds of the fleet. Then, for each scenario, from the same placed
state, time is driven by hand in 5 s steps — the interval of the reachability sweep and the reconciler in
production: the nodes still alive beat (their ``last_seen`` is written as the heartbeat flush writes it),
the reachability sweep runs, then the reconciler. Printed per scenario: replicas moved off lost nodes, the
peak moves in any 60 s, partition findings raised, nodes cordoned, and the time from the first silence until
every model again has its replicas on nodes that answer.

    python bench/storms.py --nodes 400 --moves-per-minute 20
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

PG = "postgresql://postgres@127.0.0.1:5432"
DB = os.environ.get("LLMGW_BENCH_DB", "llmgw_bench_storms")
STEP_S = 5


def reset_database() -> None:
    with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {DB}")


def setup_django() -> None:
    os.environ.update(
        LLMGW_DATA_DIR=tempfile.mkdtemp(prefix="llmgw-bench-storms-"),
        LLMGW_DATABASE_URL=f"{PG}/{DB}",
        DJANGO_SETTINGS_MODULE="llmgw.settings",
        LLMGW_HEARTBEAT_FLUSHER="manual",
    )
    os.environ.pop("LLMGW_REDIS_URL", None)
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def build(nodes: int, rack: int) -> list[str]:
    """Store the fleet, label its racks, add the models; the node names in order."""
    from django.utils import timezone

    from agent.simulator.fleet import build_fleet
    from catalog import writes as service
    from inventory.models import Node
    from inventory.writes.ingest import ingest_report

    now = timezone.now()
    north = nodes * 3 // 5
    sims = build_fleet(f"h100-hgx:{north}@north,h100-hgx:{nodes - north}@south")
    rows = Node.objects.bulk_create(Node(name=s.name, last_seen=now) for s in sims)
    for node, sim in zip(rows, sims, strict=True):
        ingest_report(node, sim.report(), now)
    names = [s.name for s in sims]
    for i, name in enumerate(names):
        Node.objects.filter(name=name).update(labels={"rack": f"r{i // rack:02d}"})
    per_model = max(1, nodes * 2 // 3 // 10)
    for m in range(10):
        profile = {"name": "gpu", "engine": "vllm", "gpu_class": "h100-80g", "gpus": 8, "nodes": 1, "tp": 8, "pp": 1}
        scaling = {"min": per_model, "max": per_model}
        service.add_model({"name": f"model-{m}", "scaling": scaling, "profiles": [profile]}, actor="bench")
    return names


def reset(names: list[str], at) -> None:
    """Every node answering and ready, the history of earlier scenarios gone, the models placed."""
    from core.models import AuditEntry, Finding
    from inventory.models import FleetEvent, Node
    from placement.models import NodeLossMove, Replica
    from placement.writes.reconciler import reconcile

    Node.objects.update(last_seen=at, reachable=True, lost=False, unreachable_since=None, state="ready")
    for model in (FleetEvent, Finding, NodeLossMove, AuditEntry, Replica):
        model.objects.all().delete()
    reconcile(at)


def satisfied(silent: set[str]) -> bool:
    """Every model has its minimum of replicas that count, none of them on a node that is silent."""
    from catalog.models import CatalogModel
    from placement.models import Replica, ReplicaState

    counting = [ReplicaState.PENDING, ReplicaState.STARTING, ReplicaState.READY]
    for model in CatalogModel.objects.all():
        good = (
            Replica.objects.filter(model=model, state__in=counting)
            .exclude(shards__node__reachable=False)
            .exclude(shards__node__name__in=silent)
            .distinct()
            .count()
        )
        if good < model.min_replicas:
            return False
    return True


def run(name: str, names: list[str], t0, script, rules, seconds: int) -> dict:
    """Drive one scenario; ``script(s)`` says which nodes are silent at ``s`` seconds."""
    from core.models import AuditEntry, Finding
    from inventory import reachability
    from inventory.models import Node
    from placement.models import NodeLossMove
    from placement.writes.reconciler import reconcile

    reset(names, t0)
    first_silence = None
    back_at = None
    started = time.perf_counter()
    for s in range(STEP_S, seconds + STEP_S, STEP_S):
        now = t0 + timedelta(seconds=s)
        silent = script(s)
        if silent and first_silence is None:
            first_silence = s
        alive = [n for n in names if n not in silent]
        Node.objects.filter(name__in=alive).update(last_seen=now, reachable=True, lost=False, unreachable_since=None)
        reachability.sweep(now, rules=rules)
        reconcile(now)
        if first_silence is not None and back_at is None and satisfied(silent):
            back_at = s
    moves = sorted((m.at - t0).total_seconds() for m in NodeLossMove.objects.all())
    peak = max((sum(1 for t in moves if a <= t < a + 60) for a in moves), default=0)
    return {
        "scenario": name,
        "moved": len(moves),
        "peak_per_min": peak,
        "partition_findings": Finding.objects.filter(kind="partition").count(),
        "cordoned": AuditEntry.objects.filter(action="cordon", actor="reachability").count(),
        "satisfied_after_s": None if back_at is None else back_at - first_silence,
        "wall_s": round(time.perf_counter() - started, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=400)
    parser.add_argument("--rack", type=int, default=20, help="nodes per rack label")
    parser.add_argument("--moves-per-minute", type=int, default=20)
    args = parser.parse_args()
    os.environ["LLMGW_MOVES_PER_MINUTE"] = str(args.moves_per_minute)
    reset_database()
    setup_django()

    from django.utils import timezone

    from inventory import reachability

    t = time.perf_counter()
    names = build(args.nodes, args.rack)
    print(f"fleet: {len(names)} HGX nodes, racks of {args.rack}, built in {time.perf_counter() - t:.0f} s")
    south = names[args.nodes * 3 // 5 :]
    racks = reachability.LossRules()
    no_racks = reachability.LossRules(labels=())
    flapper = names[0]

    def flapping(s: int) -> set[str]:
        # Silent 100 s (lost), back 50 s, three times over.
        return {flapper} if s < 450 and s % 150 < 100 else set()

    scenarios = [
        ("40 % silent (fabric south) for 90 s", lambda s: set(south) if s <= 90 else set(), racks, 300),
        ("one node lost for 10 min", lambda s: {names[1]} if s <= 600 else set(), racks, 660),
        ("a rack lost 10 min, racks are groups", lambda s: set(names[: args.rack]) if s <= 600 else set(), racks, 660),
        ("a rack lost 10 min, no rack groups", lambda s: set(names[: args.rack]) if s <= 600 else set(), no_racks, 660),
        ("a node flapping 3 times", flapping, racks, 600),
    ]
    rows = []
    for label, script, rules, seconds in scenarios:
        rows.append(run(label, names, timezone.now(), script, rules, seconds))
        print(rows[-1], flush=True)
    print()
    print(f"{'scenario':40} {'moved':>6} {'peak/min':>9} {'partitions':>11} {'cordoned':>9} {'placed again':>13}")
    for r in rows:
        after = "-" if r["satisfied_after_s"] is None else f"{r['satisfied_after_s']} s"
        print(
            f"{r['scenario']:40} {r['moved']:>6} {r['peak_per_min']:>9} {r['partition_findings']:>11} "
            f"{r['cordoned']:>9} {after:>13}"
        )


if __name__ == "__main__":
    main()
