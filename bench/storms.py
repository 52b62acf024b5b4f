"""Failure storms on a simulated fleet: how many replicas move, how fast, what is found, and when all is placed again.

Builds a fresh PostgreSQL database (``llmgw_bench_storms``), stores NODES simulated HGX nodes through the real
ingestion, labelled ``rack`` in racks of RACK nodes, on two InfiniBand fabrics (``north`` 60 %, ``south``
40 %), and places models filling about two thirds of the fleet. Then, for each scenario, from the same placed
state, time is driven by hand in 5 s steps — the interval of the reachability sweep and the reconciler in
production: the nodes still alive beat (their ``last_seen`` is written as the heartbeat flush writes it),
the reachability sweep runs, then the reconciler; the doctor's sweep every 60 s, as in production. A
scenario's faults are silences (``script``) and, for the Xid storm, full reports carrying the Xids, stored
through the real ingestion as an agent's would be. Printed per scenario: replicas moved (off lost nodes, or
drained off a held card), the peak moves in any 60 s, findings raised (partition findings apart), nodes
cordoned, and the time from the first fault until every model again has its replicas on nodes that answer.

The reconciler runs at every step where anything could have changed — the sweep changed something, moves
are waiting for the rate, a report was stored, or the last pass changed something — and is skipped at the
others, where it would find nothing to do (it is idempotent); on 2,000 nodes that is what lets the run fit
in minutes.

    python bench/storms.py --nodes 2000 --rack 18 --moves-per-minute 20
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


def build(nodes: int, rack: int) -> list:
    """Store the fleet, label its racks, add the models; the simulated nodes in order."""
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
    by_rack: dict[str, list[str]] = {}
    for i, name in enumerate(names):
        by_rack.setdefault(f"r{i // rack:03d}", []).append(name)
    for label, members in by_rack.items():
        Node.objects.filter(name__in=members).update(labels={"rack": label})
    per_model = max(1, nodes * 2 // 3 // 10)
    for m in range(10):
        profile = {"name": "gpu", "engine": "vllm", "gpu_class": "h100-80g", "gpus": 8, "nodes": 1, "tp": 8, "pp": 1}
        scaling = {"min": per_model, "max": per_model}
        service.add_model({"name": f"model-{m}", "scaling": scaling, "profiles": [profile]}, actor="bench")
    return sims


def reset(names: list[str], at) -> None:
    """Every node answering and ready, the history of earlier scenarios gone, the models placed."""
    from core.models import AuditEntry, Finding
    from inventory.models import CardHealthEvent, CardHold, FleetEvent, Node
    from placement.models import NodeLossMove, Replica
    from placement.writes.reconciler import reconcile

    Node.objects.update(
        last_seen=at, reachable=True, lost=False, unreachable_since=None, state="ready", health_cordon=""
    )
    for model in (FleetEvent, Finding, NodeLossMove, AuditEntry, Replica, CardHold, CardHealthEvent):
        model.objects.all().delete()
    reconcile(at)


def satisfied(silent: set[str]) -> bool:
    """Every model has its minimum of replicas that count, none of them on a node that is silent.

    A replica being drained (another replaces it) no longer counts; its replacement does.
    """
    from catalog.models import CatalogModel
    from placement.models import Replica, ReplicaState

    counting = [ReplicaState.PENDING, ReplicaState.STARTING, ReplicaState.READY]
    for model in CatalogModel.objects.all():
        good = (
            Replica.objects.filter(model=model, state__in=counting)
            .exclude(shards__node__reachable=False)
            .exclude(shards__node__name__in=silent)
            .exclude(replaced_by__isnull=False)
            .distinct()
            .count()
        )
        if good < model.min_replicas:
            return False
    return True


def run(name: str, names: list[str], t0, script, rules, seconds: int, reports=None) -> dict:
    """Drive one scenario; ``script(s)`` says which nodes are silent at ``s`` seconds.

    ``reports(s, now)`` stores the full reports due at ``s`` (the Xid storm's) and says whether it stored any.
    """
    from core.models import AuditEntry, Finding
    from inventory import reachability
    from inventory.models import Node
    from observability import sweeps
    from placement.models import NodeLossMove
    from placement.writes.reconciler import reconcile

    reset(names, t0)
    first_fault = None
    back_at = None
    busy = False
    reconciles = 0
    started = time.perf_counter()
    for s in range(STEP_S, seconds + STEP_S, STEP_S):
        now = t0 + timedelta(seconds=s)
        silent = script(s)
        Node.objects.exclude(name__in=silent).update(last_seen=now, reachable=True, lost=False, unreachable_since=None)
        reported = bool(reports and reports(s, now))
        if (silent or reported) and first_fault is None:
            first_fault = s
        swept = reachability.sweep(now, rules=rules)
        # A pass after one that changed nothing, with nothing new since, would change nothing either.
        if swept.changed or reported or busy:
            done = reconcile(now)
            reconciles += 1
            busy = bool(done.waiting or done.changed)
        if s % 60 == 0:
            sweeps.sweep(now)
        if first_fault is not None and back_at is None and satisfied(silent):
            back_at = s
    moves = sorted((m.at - t0).total_seconds() for m in NodeLossMove.objects.all())
    drains = sorted((a.at - t0).total_seconds() for a in AuditEntry.objects.filter(action="replace-replica"))
    moved = sorted(moves + drains)
    peak = max((sum(1 for t in moved if a <= t < a + 60) for a in moved), default=0)
    return {
        "scenario": name,
        "moved": len(moved),
        "peak_per_min": peak,
        "findings": Finding.objects.count(),
        "partition_findings": Finding.objects.filter(kind="partition").count(),
        "cordoned": AuditEntry.objects.filter(action="cordon").count(),
        "satisfied_after_s": None if back_at is None else back_at - first_fault,
        "reconciles": reconciles,
        "wall_s": round(time.perf_counter() - started, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=400)
    parser.add_argument("--rack", type=int, default=20, help="nodes per rack label")
    parser.add_argument("--moves-per-minute", type=int, default=20)
    parser.add_argument("--only", nargs="*", help="run only the scenarios whose name holds one of these words")
    args = parser.parse_args()
    os.environ["LLMGW_MOVES_PER_MINUTE"] = str(args.moves_per_minute)
    reset_database()
    setup_django()

    from django.utils import timezone

    from inventory import reachability

    t = time.perf_counter()
    sims = build(args.nodes, args.rack)
    names = [sim.name for sim in sims]
    print(
        f"fleet: {len(names)} HGX nodes, racks of {args.rack}, built in {time.perf_counter() - t:.0f} s; "
        f"moves at {args.moves_per_minute} a minute",
        flush=True,
    )
    south = names[args.nodes * 3 // 5 :]
    racks = reachability.LossRules()
    no_racks = reachability.LossRules(labels=())
    flapper = names[0]
    rack = set(names[: args.rack])

    def flapping(s: int) -> set[str]:
        # Silent 100 s (lost), back 50 s, three times over.
        return {flapper} if s < 450 and s % 150 < 100 else set()

    def xid_storm(s: int, now) -> bool:
        """Xid 79 (fallen off the bus: fatal) on one card at 30 s, then Xid 48 (DBE) on two more, 60 s apart."""
        from agent.simulator import fleet as F
        from inventory.models import Node
        from inventory.writes.ingest import ingest_report
        from placement.models import Shard

        if s not in (30, 90, 150):
            return False
        shard = Shard.objects.filter(node__name__in=names).select_related("node").order_by("node__name").first()
        sim = next(x for x in sims if x.name == shard.node.name)
        card = shard.gpu_indices[0]
        F.xid(sim, card if s == 30 else (card + s // 60) % 8, 79 if s == 30 else 48, at=now.timestamp())
        ingest_report(Node.objects.get(name=sim.name), sim.report(), now)
        return True

    def nothing(s: int) -> set[str]:
        return set()

    scenarios = [
        ("40 % silent (fabric south) for 90 s", lambda s: set(south) if s <= 90 else set(), racks, 300, None),
        ("one node lost for 10 min", lambda s: {names[1]} if s <= 600 else set(), racks, 660, None),
        ("a rack lost 10 min, held 300 s, moved", lambda s: rack if s <= 600 else set(), racks, 660, None),
        ("a rack lost 10 min, no rack groups", lambda s: rack if s <= 600 else set(), no_racks, 660, None),
        ("the whole fleet silent 400 s (held)", lambda s: set(names) if s <= 400 else set(), racks, 460, None),
        ("a node flapping 3 times", flapping, racks, 600, None),
        ("an Xid storm on one node", nothing, racks, 300, xid_storm),
    ]
    if args.only:
        scenarios = [x for x in scenarios if any(word in x[0] for word in args.only)]
    rows = []
    for label, script, rules, seconds, reports in scenarios:
        rows.append(run(label, names, timezone.now(), script, rules, seconds, reports))
        print(rows[-1], flush=True)
    print()
    print(
        f"{'scenario':40} {'moved':>6} {'peak/min':>9} {'findings':>9} {'partitions':>11} {'cordoned':>9} "
        f"{'placed again':>13} {'wall':>7}"
    )
    for r in rows:
        after = "-" if r["satisfied_after_s"] is None else f"{r['satisfied_after_s']} s"
        print(
            f"{r['scenario']:40} {r['moved']:>6} {r['peak_per_min']:>9} {r['findings']:>9} "
            f"{r['partition_findings']:>11} {r['cordoned']:>9} {after:>13} {r['wall_s']:>6.0f}s"
        )


if __name__ == "__main__":
    main()
