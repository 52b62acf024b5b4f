"""How long a Prometheus scrape of ``/metrics`` takes on a 2,000-node fleet.

Builds the fleet in a fresh PostgreSQL database (``llmgw_bench_metrics``)
through the real ingestion path (inventory.writes.ingest.ingest_report, the
simulator's reports; no HTTP), adds a catalog with replicas holding GPUs and
a few open findings, then times the whole answer of /metrics (this process's
registry and the fleet's) and the doctor sweep. Prints figures; not a test.
The scrape should stay under a second.

    python bench/metrics.py [--spec SPEC] [--repeats N] [--reuse]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

PG = "postgresql://postgres@127.0.0.1:5432"
DB = "llmgw_bench_metrics"
# 50 NVL72 racks (900 trays), 1,000 HGX, 50 MIG nodes, 50 CPU nodes: 2,000 nodes, 11,800 GPUs.
SPEC = "gb200-nvl72:50@north,h100-hgx:1000@south,a100-mig:50,cpu:50"


def reset_database() -> None:
    with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {DB}")


def setup_django() -> None:
    os.environ["LLMGW_DATABASE_URL"] = f"{PG}/{DB}"
    os.environ.setdefault("LLMGW_DATA_DIR", "/tmp/llmgw-bench-metrics")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmgw.settings")
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)


def build(spec: str) -> int:
    from django.utils import timezone

    from agent.simulator.fleet import build_fleet, gpu_lost, imex_down, tray_leave
    from inventory.models import Node
    from inventory.writes.ingest import ingest_report

    now = timezone.now()
    sims = build_fleet(spec)
    # A few faults, so the figures are not all ones.
    tray_leave(sims[3])
    imex_down(sims[40])
    gpu_lost(sims[950], 2)
    started = time.perf_counter()
    for sim in sims:
        ingest_report(Node.objects.create(name=sim.name, last_seen=now), sim.report(), now)
    print(f"ingested {len(sims)} nodes in {time.perf_counter() - started:.1f} s")
    return len(sims)


def place(models: int = 20, replicas_per_model: int = 20) -> None:
    """Replicas of 4 GPUs each on the HGX nodes, as a busy fleet has them."""
    from catalog.models import CatalogModel
    from inventory.models import Node
    from placement.models import Replica, Shard

    hgx = list(Node.objects.filter(name__startswith="hgx-").order_by("name"))
    shards = []
    for m in range(models):
        model = CatalogModel.objects.create(name=f"model-{m:02d}", max_replicas=replicas_per_model)
        for r in range(replicas_per_model):
            replica = Replica.objects.create(model=model, profile_name="hgx", state="ready")
            node = hgx[(m * replicas_per_model + r) // 2]
            first = 4 * ((m * replicas_per_model + r) % 2)
            shards.append(Shard(replica=replica, node=node, gpu_indices=list(range(first, first + 4))))
    Shard.objects.bulk_create(shards)


def timed(fn, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        out.append(time.perf_counter() - started)
    return out


def report(what: str, seconds: list[float]) -> None:
    ms = sorted(s * 1000 for s in seconds)
    print(f"{what}: median {statistics.median(ms):.0f} ms, min {ms[0]:.0f} ms, max {ms[-1]:.0f} ms ({len(ms)} runs)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--spec", default=SPEC)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--reuse", action="store_true", help="time the fleet a previous run left in the database")
    args = p.parse_args()
    if not args.reuse:
        reset_database()
    setup_django()
    from inventory.models import Node

    if not args.reuse:
        build(args.spec)
        place()
    nodes = Node.objects.count()

    from django.db import connection
    from django.test.utils import CaptureQueriesContext
    from django.utils import timezone

    from inventory.models import GPU
    from observability import metrics, sweeps

    print(f"fleet: {nodes} nodes, {GPU.objects.count()} GPUs")
    sweep = timed(lambda: sweeps.sweep(timezone.now()), 3)
    report("doctor sweep", sweep)
    metrics.observe_reconcile(0.2)
    body = metrics.exposition()
    with CaptureQueriesContext(connection) as queries:
        metrics.exposition()
    series = sum(1 for line in body.decode().splitlines() if line and not line.startswith("#"))
    print(f"scrape: {len(body) / 1024:.0f} KiB, {series} series, {len(queries)} queries")
    report("scrape of /metrics (both registries)", timed(metrics.exposition, args.repeats))


if __name__ == "__main__":
    main()
