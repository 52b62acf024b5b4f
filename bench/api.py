"""Admin API latency on a large fleet: how long do ``/api/v1/summary`` and ``/api/v1/nodes`` take?

Builds a fresh PostgreSQL database (``llmgw_bench_api``), stores a simulated
fleet of NODES nodes through the real ingestion (``ingest_report``, one full
report per node, as each agent's registration would), places a replica on
every HGX node, then times N requests of each endpoint (the what-if too) through Django and DRF
in-process — the server's own work, without the network or daphne — and
prints p50/p99 and the queries per request.

    python bench/api.py --nodes 2000 --requests 50

``--reuse`` keeps the database a previous run built when it holds a fleet of
NODES nodes (migrated forward, so a new column's backfill runs on it), since
building 10,000 nodes takes minutes; ``--only PATH`` times one endpoint.
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

from bench import djangodb

PG = "postgresql://postgres@127.0.0.1:5432"
DB = os.environ.get("LLMGW_BENCH_DB", "llmgw_bench_api")
# The node listing twice: in full (every card and port, as the seeds list them) and as `ctl nodes` asks for it.
LEAN_NODES = "/api/v1/nodes?fields=id,state,reachable,devices,replicas,nvlink_domain,load,last_seen_seconds"
# The what-if plans the whole fleet twice: one node, and a whole fabric.
WHAT_IF = ("/api/v1/what-if?lose=hgx-000", "/api/v1/what-if?lose=south")
PATHS = ("/api/v1/summary", "/api/v1/nodes", LEAN_NODES, "/api/v1/replicas", "/api/v1/nvlink", *WHAT_IF)


def exists() -> bool:
    with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
        return conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [DB]).fetchone() is not None


def reset_database() -> None:
    with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {DB}")


def spec_for(nodes: int) -> str:
    """About a fifth GB200 racks, most of the rest 8-GPU HGX on two fabrics, some MIG and CPU nodes."""
    racks = max(1, nodes // 5 // 18)
    mig, cpu = max(1, nodes // 20), max(1, nodes // 50)
    hgx = max(2, nodes - racks * 18 - mig - cpu)
    north = hgx * 4 // 5
    return f"gb200-nvl72:{racks},h100-hgx:{north}@north,h100-hgx:{hgx - north}@south,a100-mig:{mig},cpu:{cpu}"


def setup_django() -> None:
    djangodb.setup_django(f"{PG}/{DB}", "llmgw-bench-api-")


def build(nodes: int) -> tuple[int, int, float]:
    """Store the fleet and its replicas; (nodes, replicas, seconds spent ingesting)."""
    from django.utils import timezone

    from agent.simulator.fleet import build_fleet
    from catalog import writes as service
    from inventory.models import Node
    from inventory.writes.ingest import ingest_report
    from placement.models import Replica, Shard

    now = timezone.now()
    sims = build_fleet(spec_for(nodes))
    started = time.perf_counter()
    rows = Node.objects.bulk_create(Node(name=s.name, last_seen=now) for s in sims)
    for node, sim in zip(rows, sims, strict=True):
        ingest_report(node, sim.report(), now)
    took = time.perf_counter() - started
    model = service.add_model(
        {
            "name": "llama-8b",
            "source": "hf://meta-llama/Llama-3.1-8B-Instruct",
            "scaling": {"min": 1, "max": 100_000},
            "profiles": [{"name": "h100", "engine": "vllm", "gpu_class": "h100-80g", "gpus": 2, "tp": 2}],
        },
        actor="bench",
    )
    profile = model.profiles.get()
    hgx = [n for n, s in zip(rows, sims, strict=True) if s.kind == "h100-hgx"]
    replicas = Replica.objects.bulk_create(
        Replica(
            model=model, profile=profile, profile_name="h100", profile_fingerprint=profile.fingerprint, state="ready"
        )
        for _ in hgx
    )
    Replica.objects.update(state="ready")
    Shard.objects.bulk_create(
        Shard(replica=r, node=n, rank=0, gpu_indices=[0, 1], state="ready") for r, n in zip(replicas, hgx, strict=True)
    )
    # What autovacuum would have done by now on a fleet this size: the planner needs the row counts.
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    return len(rows), len(replicas), took


def measure(requests: int, paths: tuple[str, ...] = PATHS) -> list[tuple[str, float, float, float, int]]:
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test.utils import CaptureQueriesContext
    from rest_framework.test import APIClient

    from core.models import ApiToken

    user, _ = get_user_model().objects.get_or_create(username="bench")
    _, secret = ApiToken.issue(user, "bench")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    out = []
    for path in paths:
        client.get(path)  # warm: imports, the token's last_used_at
        times = []
        for _ in range(requests):
            started = time.perf_counter()
            answer = client.get(path)
            times.append((time.perf_counter() - started) * 1000)
            assert answer.status_code == 200, answer.content[:300]
        with CaptureQueriesContext(connection) as seen:
            size = len(client.get(path).content)
        times.sort()
        p99 = times[min(len(times) - 1, int(len(times) * 0.99))]
        out.append((path, statistics.median(times), p99, size / 1e6, len(seen)))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--requests", type=int, default=50)
    parser.add_argument("--reuse", action="store_true", help="keep the last run's fleet if it has NODES nodes")
    parser.add_argument("--only", action="append", help="time this endpoint only (repeatable)")
    args = parser.parse_args()
    reused = args.reuse and exists()
    if not reused:
        reset_database()
    setup_django()
    from inventory.models import GPU, Node
    from placement.models import Replica

    if reused and Node.objects.count() != args.nodes:
        print(f"{DB} holds {Node.objects.count()} nodes, not {args.nodes}: build it without --reuse", file=sys.stderr)
        return 2
    if reused:
        nodes, replicas, took = Node.objects.count(), Replica.objects.count(), 0.0
    else:
        nodes, replicas, took = build(args.nodes)

    print(f"fleet: {nodes} nodes, {GPU.objects.count()} GPU rows, {replicas} replicas (ingested in {took:.1f} s)")
    print(f"{'endpoint':<22}{'p50 ms':>9}{'p99 ms':>9}{'MB':>7}{'queries':>9}   ({args.requests} requests each)")
    for path, p50, p99, mb, queries in measure(args.requests, tuple(args.only or PATHS)):
        shown = path.split("=")[0] + "=…" if "=" in path else path
        print(f"{shown:<22}{p50:>9.1f}{p99:>9.1f}{mb:>7.2f}{queries:>9}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
