"""What one registration and one heartbeat cost the server, measured in this process (no sockets).

bench/scale.py measures the write side through ``llmgw serve``, where the
load generator, PostgreSQL and the server share the cores and a figure moves
with whatever else runs. This is the cheap, precise view of the same paths:

1. A fresh PostgreSQL database (``LLMGW_BENCH_DB``, default
   ``llmgw_bench_register``) is migrated and a join token issued.
2. ``--nodes`` simulated nodes (bench/scale.py's fleet mix) register by
   calling the register view itself (``agentapi.views.register``) with each
   node's full report, as the endpoint does: wall time per registration, the
   queries of each (mean, and the largest), then the same again under
   cProfile (``--profile``: the top functions by their own time).
3. Every node heartbeats once through the fast lane's ASGI handler
   (``agentapi.fast.heartbeat``) and the desk's batch is flushed, ``--rounds``
   times: CPU per beat taken, CPU and queries per flush.
4. ``--dump FILE`` writes every inventory row the registrations stored
   (primary keys and timestamps left out), so two commits' rows can be
   compared: ``python bench/register_cost.py --dump a.json`` on each, then
   ``cmp a.json b.json``.

    python bench/register_cost.py --nodes 500 --profile

``LLMGW_BENCH_REDIS_URL`` set: the live pages' messages go to that Redis, as
in ``llmgw serve``; unset, they are not sent (nothing listens).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import json
import os
import pstats
import statistics
import sys
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import djangodb
from bench.scale import spec_for

PG = "postgresql://postgres@127.0.0.1:5432"
DB = os.environ.get("LLMGW_BENCH_DB", "llmgw_bench_register")
REDIS = os.environ.get("LLMGW_BENCH_REDIS_URL")

# Columns that differ between two runs of the same fleet for reasons of their own: ids, clocks, secrets.
VOLATILE = {
    "id",
    "node",
    "domain",
    "last_seen",
    "last_report_at",
    "created_at",
    "updated_at",
    "registered_at",
    "first_seen",
    "credential_digest",
}


def setup() -> None:
    with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {DB}")
    djangodb.setup_django(f"{PG}/{DB}", "llmgw-bench-register-")
    if REDIS:
        from django.conf import settings

        settings.CHANNEL_LAYERS = {
            "default": {"BACKEND": "channels_redis.core.RedisChannelLayer", "CONFIG": {"hosts": [REDIS]}}
        }


def requests_for(sims: list, join: str) -> list:
    from django.test import RequestFactory

    factory = RequestFactory()
    return [
        factory.post(
            "/api/v1/agent/register",
            data=json.dumps({"name": s.name, "machine_id": f"m-{s.name}", "report": s.report()}),
            content_type="application/json",
            HTTP_AUTHORIZATION=f"Bearer {join}",
        )
        for s in sims
    ]


def register_all(requests: list, profile: cProfile.Profile | None) -> tuple[list[str], list[float], list[int]]:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from agentapi.views import register

    creds, times, queries = [], [], []
    for request in requests:
        connection.queries_log.clear()  # it keeps the last 9,000: past that, a capture counts none
        with CaptureQueriesContext(connection) as seen:
            started = time.perf_counter()
            if profile:
                profile.enable()
            answer = register(request)
            if profile:
                profile.disable()
            times.append(time.perf_counter() - started)
        assert answer.status_code == 201, answer.content
        creds.append(json.loads(answer.content)["credential"])
        queries.append(len(seen))
    return creds, times, queries


async def beat_all(creds: list[str], body: bytes) -> None:
    from agentapi import fast

    async def send(_message) -> None:
        pass

    for cred in creds:
        sent = False

        async def receive():
            nonlocal sent
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        scope = {
            "type": "http",
            "method": "POST",
            "path": fast.PATH,
            "headers": [(b"authorization", f"Bearer {cred}".encode()), (b"content-length", str(len(body)).encode())],
        }
        await fast.heartbeat(scope, receive, send)


def heartbeat_rounds(creds: list[str], rounds: int, profile: cProfile.Profile | None) -> dict:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from inventory.writes.heartbeats import desk

    body = json.dumps({"load": {"cpu_percent": 12.5, "load1": 0.8}, "shards": []}).encode()
    take, flush, flush_queries = [], [], []
    for _ in range(rounds):
        started = time.process_time()
        if profile:
            profile.enable()
        asyncio.run(beat_all(creds, body))
        taken = time.process_time()
        connection.queries_log.clear()
        with CaptureQueriesContext(connection) as seen:
            result = desk.flush()
        if profile:
            profile.disable()
        assert result.written == len(creds), result
        take.append((taken - started) / len(creds) * 1000)
        flush.append((time.process_time() - taken) / len(creds) * 1000)
        flush_queries.append(len(seen))
    return {"take": statistics.median(take), "flush": statistics.median(flush), "flush_queries": flush_queries}


def dump(path: Path) -> None:
    """Every inventory row the fleet's registrations stored, by natural key, volatile columns left out."""
    from django.core import serializers

    from inventory import models

    rows = []
    for model in (models.Node, models.GPU, models.IBPort, models.NVLinkDomain, models.CardHealthEvent):
        for obj in model.objects.all():
            fields = json.loads(serializers.serialize("json", [obj]))[0]["fields"]
            natural = {
                models.Node: lambda o: [o.name],
                models.GPU: lambda o: [o.node.name, o.index],
                models.IBPort: lambda o: [o.node.name, o.hca, o.port],
                models.NVLinkDomain: lambda o: [o.cluster_uuid, o.clique_id],
                models.CardHealthEvent: lambda o: [o.node.name, o.gpu_index, o.what],
            }[model](obj)
            if model is models.GPU and obj.domain_id:
                natural.append(obj.domain.key)
            kept = {k: v for k, v in fields.items() if k not in VOLATILE}
            rows.append([model.__name__, natural, kept])
    rows.sort(key=lambda r: json.dumps(r[:2]))
    path.write_text("\n".join(json.dumps(r, sort_keys=True) for r in rows) + "\n")
    print(f"{len(rows)} rows written to {path}")


def scanned_rows(registrations: int) -> str:
    """Rows each inventory table gave sequential scans, per registration: a figure that grows with the fleet
    is a scan where an index was meant (a plan PL/pgSQL kept from when the table was small, say)."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("SELECT pg_stat_force_next_flush()")  # this backend's counts, as of its last transaction
    time.sleep(0.5)
    with psycopg.connect(f"{PG}/{DB}") as conn:
        rows = conn.execute(
            "SELECT relname, seq_tup_read FROM pg_stat_user_tables WHERE relname LIKE 'inventory_%' "
            "AND seq_tup_read > 0 ORDER BY seq_tup_read DESC"
        ).fetchall()
    return ", ".join(f"{name} {read / registrations:.1f}" for name, read in rows) or "none"


def top(profile: cProfile.Profile, lines: int) -> str:
    out = io.StringIO()
    pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(lines)
    return out.getvalue()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3, help="heartbeat rounds of the whole fleet")
    parser.add_argument("--profile", action="store_true", help="print cProfile's top functions")
    parser.add_argument("--lines", type=int, default=30)
    parser.add_argument("--dump", type=Path, help="write the stored rows here, for comparing two commits")
    args = parser.parse_args()
    os.environ["LLMGW_HEARTBEAT_FLUSHER"] = "manual"
    setup()
    from agent.simulator.fleet import build_fleet
    from llmgw.bootstrap import issue_join_token

    sims = build_fleet(spec_for(args.nodes))
    requests = requests_for(sims, issue_join_token())
    reg_profile = cProfile.Profile() if args.profile else None
    cpu0, wall0 = time.process_time(), time.monotonic()
    creds, times, queries = register_all(requests, reg_profile)
    cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
    n = len(sims)
    print(f"== {n} nodes ({spec_for(args.nodes)})")
    each, cpu_each = wall / n * 1000, cpu / n * 1000
    print(f"registration: {wall:.1f} s wall, {each:.1f} ms each, {cpu_each:.1f} ms CPU of this process")
    print(f"  p50 {statistics.median(times) * 1000:.1f} ms, p99 {sorted(times)[int(n * 0.99)] * 1000:.1f} ms")
    print(f"  queries: mean {statistics.mean(queries):.1f}, max {max(queries)}, min {min(queries)}")
    print(f"  rows read by sequential scans, per registration: {scanned_rows(n)}")
    if args.dump:
        dump(args.dump)
    beat_profile = cProfile.Profile() if args.profile else None
    beats = heartbeat_rounds(creds, args.rounds, beat_profile)
    print(
        f"heartbeat: {beats['take']:.3f} ms CPU to take a beat, {beats['flush']:.3f} ms CPU per beat to flush "
        f"({n} beats a flush, queries per flush {beats['flush_queries']})"
    )
    if args.profile:
        print("\n---- registration, by own time\n" + top(reg_profile, args.lines))
        print("\n---- heartbeats (take + flush), by own time\n" + top(beat_profile, args.lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
