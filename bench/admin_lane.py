"""The admin listener's heartbeat: its CPU per beat with the inline protocol, against the ASGI way, in one run.

bench/scale.py measures heartbeats through the whole of ``llmgw serve``,
where a figure moves with whatever else the machine runs (the same code gave
0.27 and 0.37 ms on one day). This isolates one admin process and compares
its two ways of answering a beat under the same load, alternately, so that
the drift of the machine falls on both:

- ``inline``: ``llmgw.admin_server.serve`` as shipped (llmgw.admin_protocol
  answers a known node's beat inside uvicorn's parser);
- ``asgi``: the same, with the listeners' bounded protocol alone
  (llmgw.listener_protocol: uvicorn's httptools protocol and the limits),
  which serves every beat as an ASGI request (agentapi.fast.heartbeat), as before.

A fresh PostgreSQL database (``llmgw_bench_lane``) gets ``--nodes`` nodes,
each with a credential (rows written directly: a beat needs no more). Each
round starts one admin process, drives every node's beat every
``--heartbeat`` seconds over ``--connections`` kept sockets (bench/loadgen.py),
lets the first heartbeat period pass (the desk learns the fleet), then reads
the process's CPU over ``--seconds``. The default, 5,000 nodes every 5 s, is
what each of two admin processes takes at 10,000 nodes. Rounds alternate,
``--rounds`` of each; the ratio is of their medians.

    python bench/admin_lane.py --nodes 5000 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.ingest import cpu_seconds, pct
from bench.loadgen import drive_fleet, encode_post
from bench.serve import free_port

PG = "postgresql://postgres@127.0.0.1:5432"
DB = "llmgw_bench_lane"
BEAT = b'{"load": {"cpu_percent": 12.5, "load1": 0.8}, "shards": []}'


def make_fleet(nodes: int) -> list[str]:
    """A fresh database with ``nodes`` nodes; their credentials."""
    with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {DB}")
    from bench.djangodb import setup_django

    setup_django(f"{PG}/{DB}", "llmgw-bench-lane-")
    from django.utils import timezone

    from core.credentials import hash_token, new_token
    from inventory.models import Node

    credentials = [new_token("llmgw_node_") for _ in range(nodes)]
    now = timezone.now()
    Node.objects.bulk_create(
        [
            Node(name=f"lane-{i:05d}", machine_id=f"m-{i}", credential_digest=hash_token(c), last_seen=now)
            for i, c in enumerate(credentials)
        ],
        batch_size=2000,
    )
    return credentials


def start(way: str, port: int) -> subprocess.Popen:
    """One admin process, serving ``way``; returned once it answers."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMGW_")}
    env.update(
        LLMGW_DATA_DIR=tempfile.mkdtemp(prefix="llmgw-bench-lane-"),
        LLMGW_DATABASE_URL=f"{PG}/{DB}",
        DJANGO_SETTINGS_MODULE="llmgw.settings",
    )
    proc = subprocess.Popen(
        [sys.executable, __file__, "--serve", way, "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200:
                return proc
        except httpx.TransportError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"the {way} admin process did not start: {proc.stderr.read().decode()[-2000:]}")


def serve(way: str, port: int) -> None:
    """The child: ``llmgw.admin_server.serve``, with the bounded protocol in place of the admin one for ``asgi``."""
    if way == "asgi":
        import llmgw.asgi  # noqa: F401  (Django first: the admin protocol's imports need it)
        from llmgw import admin_protocol
        from llmgw.listener_protocol import BoundedHttpProtocol

        admin_protocol.AdminHttpProtocol = BoundedHttpProtocol  # what admin_server.serve imports when it runs
    from llmgw import admin_server

    admin_server.serve(host="127.0.0.1", port=port)


def one_round(way: str, requests: list[bytes], args) -> dict:
    port = free_port()
    proc = start(way, port)
    try:

        async def drive(seconds: float):
            return await drive_fleet(
                "127.0.0.1",
                port,
                requests,
                requests,
                heartbeat_s=args.heartbeat,
                report_s=args.heartbeat * 1000,
                seconds=seconds,
                connections=args.connections,
            )

        asyncio.run(drive(args.heartbeat))  # the desk learns the fleet
        cpu0, client0 = cpu_seconds(proc.pid), time.process_time()
        run = asyncio.run(drive(args.seconds))
        cpu, client = cpu_seconds(proc.pid) - cpu0, time.process_time() - client0
    finally:
        proc.terminate()
        proc.wait(30)
    answered = len(run.samples["heartbeat"]) + len(run.samples["report"])
    return {
        "way": way,
        "cpu_ms": cpu / max(1, answered) * 1000,
        "client_ms": client / max(1, answered) * 1000,
        "p99_ms": pct(run.samples["heartbeat"] + run.samples["report"], 99),
        "errors": sum(run.errors.values()),
        "rate": answered / run.elapsed,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--heartbeat", type=float, default=5.0)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each way, alternating")
    parser.add_argument("--serve", choices=("inline", "asgi"), help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.port)
        return 0
    credentials = make_fleet(args.nodes)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # Django's logging set it to say each request
    requests = [encode_post("127.0.0.1", "/api/v1/agent/heartbeat", c, BEAT) for c in credentials]
    results: dict[str, list[dict]] = {"inline": [], "asgi": []}
    print(f"{args.nodes} nodes, a beat each every {args.heartbeat} s, one admin process; CPU over {args.seconds} s")
    print(f"{'round':>5} {'way':>6} {'beats/s':>8} {'CPU ms/beat':>12} {'client ms':>10} {'p99 ms':>8} {'errors':>6}")
    for i in range(args.rounds):
        for way in ("inline", "asgi") if i % 2 == 0 else ("asgi", "inline"):
            r = one_round(way, requests, args)
            results[way].append(r)
            print(
                f"{i + 1:>5} {way:>6} {r['rate']:>8.0f} {r['cpu_ms']:>12.3f} {r['client_ms']:>10.3f}"
                f" {r['p99_ms']:>8.1f} {r['errors']:>6}",
                flush=True,
            )
    inline = statistics.median(r["cpu_ms"] for r in results["inline"])
    asgi = statistics.median(r["cpu_ms"] for r in results["asgi"])
    print(f"median CPU per beat: inline {inline:.3f} ms, asgi {asgi:.3f} ms; inline/asgi {inline / asgi:.2f}")
    with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
