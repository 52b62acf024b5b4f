"""Ingestion under a simulated fleet: can the control plane keep up with its heartbeats?

Starts ``llmgw serve`` on PostgreSQL (a fresh ``llmgw_bench`` database) with
Redis as channel layer and broker, registers a simulated fleet of 8-GPU HGX
nodes, and drives it for a while: a light heartbeat from every node every
``--heartbeat`` seconds and a full report every ``--report`` seconds. Prints
the sustained heartbeat rate against the rate the fleet asks for, p50/p99
latency per request kind, and the database writes per request (from
pg_stat_database).

    python bench/ingest.py --nodes 2000 --seconds 60
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agent.simulator.fleet import build_fleet
from agent.simulator.runner import Simulation
from bench.loadgen import drive_fleet_as_told, encode_post
from bench.serve import start_serve

PG = "postgresql://postgres@127.0.0.1:5432"
DB = "llmgw_bench"


def reset_database() -> None:
    with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {DB}")


def db_counters() -> dict[str, int]:
    with psycopg.connect(f"{PG}/postgres") as conn:
        row = conn.execute(
            "select xact_commit, tup_inserted, tup_updated, tup_deleted from pg_stat_database where datname=%s", (DB,)
        ).fetchone()
    return dict(zip(("commits", "inserted", "updated", "deleted"), row, strict=True))


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_server(data: Path, redis: str) -> tuple[subprocess.Popen, str]:
    proc = start_serve(data, f"{PG}/{DB}", redis, timeout_s=90)
    return proc, proc.admin


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(p / 100 * len(values)))] * 1000


async def register_fleet(admin: str, join: str, args) -> list[tuple[str, bytes]]:
    """Register the fleet over the real protocol; answer each node's credential and report body."""
    registered: dict[str, str] = {}
    nodes = build_fleet(f"h100-hgx:{args.nodes}")
    sim = Simulation(
        f"http://{admin}",
        join,
        nodes,
        heartbeat_interval_s=3600,
        report_interval_s=3600,
        stagger_s=0,
        max_connections=args.connections,
    )
    started = time.monotonic()
    await sim.start()
    await sim.wait_registered(timeout=900)
    registered.update(sim.credentials)
    await sim.stop()
    print(f"registered {len(nodes)} nodes ({len(nodes) * 8} GPUs) in {time.monotonic() - started:.1f} s")
    return [(registered[n.name], json.dumps(n.report()).encode()) for n in nodes]


async def drive(admin: str, join: str, args, pid: int) -> None:
    fleet = await register_fleet(admin, join, args)
    beat_body = json.dumps({"load": {"cpu_percent": 12.5, "load1": 0.8}, "shards": []}).encode()
    beats = [encode_post(admin, "/api/v1/agent/heartbeat", cred, beat_body) for cred, _ in fleet]
    reports = [encode_post(admin, "/api/v1/agent/report", cred, body) for cred, body in fleet]
    before, cpu_before = db_counters(), cpu_seconds(pid)
    run = await drive_fleet_as_told(admin, beats, reports, args, args.seconds)
    after, cpu_after = db_counters(), cpu_seconds(pid)
    samples, errors, elapsed = run.samples, run.errors, run.elapsed
    report_results(args, samples, errors, elapsed, before, after, cpu_after - cpu_before)


def report_results(args, samples, errors, elapsed, before, after, cpu) -> None:
    beats, reports = len(samples["heartbeat"]), len(samples["report"])
    every = max(1, round(args.report / args.heartbeat))
    wanted_beats = args.nodes / args.heartbeat * (1 - 1 / every)

    writes = sum(after[k] - before[k] for k in ("inserted", "updated", "deleted"))
    commits = after["commits"] - before["commits"]
    total = max(1, beats + reports)
    print(
        f"measured {elapsed:.0f} s; the server process used {cpu:.0f} CPU-seconds ({cpu / elapsed * 100:.0f}% of "
        "one core)"
    )
    print(
        f"heartbeats: {beats / elapsed:.0f}/s answered, the fleet sends {wanted_beats:.0f}/s "
        f"(ratio {beats / elapsed / wanted_beats:.2f}); latency p50 {pct(samples['heartbeat'], 50):.1f} ms, "
        f"p99 {pct(samples['heartbeat'], 99):.1f} ms"
    )
    print(
        f"full reports: {reports / elapsed:.1f}/s, the fleet sends {args.nodes / args.report:.1f}/s; "
        f"latency p50 {pct(samples['report'], 50):.1f} ms, p99 {pct(samples['report'], 99):.1f} ms"
    )
    print(
        f"database: {writes / total:.2f} rows written and {commits / total:.3f} commits per request "
        f"({writes} rows, {commits} commits)"
    )
    print(f"errors: {dict(errors) or 'none'}")
    behind = pct(samples["heartbeat"], 99) > args.heartbeat * 1000
    print(
        "FALLING BEHIND: heartbeats wait longer than their interval"
        if behind
        else "keeping up: every heartbeat answered well within its interval"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=2000)
    p.add_argument("--seconds", type=float, default=60)
    p.add_argument("--heartbeat", type=float, default=5.0)
    p.add_argument("--report", type=float, default=60.0)
    p.add_argument("--connections", type=int, default=32)
    p.add_argument("--redis", default="redis://127.0.0.1:6379/13")
    args = p.parse_args()
    data = Path(os.environ.get("TMPDIR", "/tmp")) / f"llmgw-bench-ingest-{os.getpid()}"
    data.mkdir(parents=True)
    reset_database()
    proc, admin = start_server(data, args.redis)
    try:
        asyncio.run(drive(admin, (data / "join-token").read_text().strip(), args, proc.pid))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)


if __name__ == "__main__":
    main()
