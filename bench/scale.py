"""Ten thousand nodes on one control host: issue 16's figures at 2,000, 5,000 and 10,000 nodes.

For each size, in its own fresh PostgreSQL database (``llmgw_bench_scale``):

1. ``llmgw serve`` starts on it (Redis as channel layer and broker; two
   processes on the admin listener, ``--admin-workers``) and the
   whole fleet registers through the real protocol, each node's full report
   in its registration, from pre-encoded requests, ``--register-connections``
   at a time, each on a connection of its own as an agent's is
   (bench/loadgen.py; ``--register-keep-alive`` sends them over that many
   sockets kept open instead, which one of several admin processes may
   accept all of). The registrations build the fleet every later figure
   reads: a hundredth of the nodes are GB200 NVL72 racks (18 trays each, so
   100 racks at 10,000), a fiftieth A100 MIG boxes, a hundredth CPU nodes,
   the rest 8-GPU HGX on two InfiniBand fabrics.
2. Every node heartbeats every 5 s through the fast lane, a full (unchanged)
   report every 60 s in place of one beat, for ``--seconds``: the held ratio,
   p99, and the CPU the server's processes spent per request; the load
   generator's own CPU per request beside it. The first heartbeat period
   (``--warmup``) goes before and its CPU is printed apart: there each of
   several admin processes meets the nodes the others registered.
3. The serve process tree's resident memory, then serve is stopped.
4. A replica on every HGX node, then the read side in this process through
   Django (the server's own work, no network): ``/api/v1/summary``,
   ``/api/v1/nodes`` (its peak Python memory and whether it is streamed),
   ``/api/v1/nvlink``, ``/api/v1/replicas``, a ``/metrics`` scrape, a doctor
   sweep, the console's fleet, nodes and NVLink (rack) pages; the p50 and the
   queries of each.

Then, once, the scheduler: 20,000 nodes / about 160,000 GPUs / 4,000 models
(bench/schedule.py's fleet four times over), planned from empty, and planned
again after one node is cordoned.

    python bench/scale.py --sizes 2000,5000,10000 --seconds 30

Registering 10,000 nodes takes minutes, so a registered fleet can be kept and
its read side measured again on a copy (each size's database is
``NAME_<size>``; the copy is made by ``CREATE DATABASE ... TEMPLATE``):

    python bench/scale.py --sizes 10000 --seconds 0 --no-scheduler --keep-db h3_scale
    python bench/scale.py --sizes 10000 --no-scheduler --read-only-from h3_scale

Timings on a shared 2-core machine are noisy; each is printed with its size.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from dataclasses import replace
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import djangodb
from bench.ingest import cpu_seconds, pct
from bench.livewatch import LiveWatch
from bench.loadgen import Connection, drive_fleet_as_told, encode_post
from bench.serve import start_serve

PG = "postgresql://postgres@127.0.0.1:5432"
DB = os.environ.get("LLMGW_BENCH_DB", "llmgw_bench_scale")
TEMPLATE = DB + "_migrated"
REDIS = os.environ.get("LLMGW_BENCH_REDIS_URL", "redis://127.0.0.1:6379/11")
READ_PATHS = ("/api/v1/summary", "/api/v1/nodes", "/api/v1/nvlink", "/api/v1/replicas")
PAGES = ("/admin/fleet/", "/admin/nodes/", "/admin/nvlink/")


def spec_for(nodes: int) -> str:
    racks, mig, cpu = max(1, nodes // 100), max(1, nodes // 50), max(1, nodes // 100)
    hgx = nodes - racks * 18 - mig - cpu
    north = hgx * 3 // 5
    return f"gb200-nvl72:{racks}@gb,h100-hgx:{north}@north,h100-hgx:{hgx - north}@south,a100-mig:{mig},cpu:{cpu}"


# ---------------------------------------------------------------- databases


def admin_sql(*statements: str) -> None:
    with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


def setup_django() -> None:
    """Django in this process on DB, migrated once; TEMPLATE keeps the migrated, empty schema for each size."""
    admin_sql(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)", f"CREATE DATABASE {DB}")
    djangodb.setup_django(f"{PG}/{DB}", "llmgw-bench-scale-")
    from django.db import connections

    connections.close_all()
    admin_sql(f"DROP DATABASE IF EXISTS {TEMPLATE} WITH (FORCE)", f"CREATE DATABASE {TEMPLATE} TEMPLATE {DB}")


def fresh_database(template: str = TEMPLATE) -> None:
    """DB made again from ``template``: the migrated, empty schema, or a kept fleet."""
    from django.db import connections

    connections.close_all()
    admin_sql(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)", f"CREATE DATABASE {DB} TEMPLATE {template}")


def keep_database(name: str) -> None:
    """A copy of DB as it stands (the fleet registered, replicas placed) under ``name``, for --read-only-from."""
    from django.db import connections

    connections.close_all()
    admin_sql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)", f"CREATE DATABASE {name} TEMPLATE {DB}")


# ---------------------------------------------------------------- the server


def tree(pid: int) -> list[int]:
    """The process and all its descendants."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        for task in Path(f"/proc/{p}/task").glob("*"):
            with contextlib.suppress(OSError):
                todo += [int(c) for c in (task / "children").read_text().split()]
    return out


def tree_cpu(pid: int) -> dict[int, float]:
    """CPU seconds of each process in the tree, and (as pid -1) of the PostgreSQL backends serving its database."""
    out = {}
    for p in tree(pid):
        with contextlib.suppress(OSError):
            out[p] = cpu_seconds(p)
    out[-1] = database_cpu()
    return out


def database_cpu() -> float:
    """CPU seconds of the PostgreSQL backends connected to the benchmark's database (they are not serve's children).

    A backend that exits between two readings takes its seconds with it, so this
    undercounts churn; serve keeps its connections, so there is little.
    """
    total = 0.0
    mark = f" {DB} ".encode()
    for proc in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            command = proc.joinpath("cmdline").read_bytes().replace(b"\0", b" ")
            if command.startswith(b"postgres:") and mark in command:
                total += cpu_seconds(int(proc.name))
    return total


def cpu_spent(before: dict[int, float], after: dict[int, float]) -> tuple[float, float]:
    """(all the tree's processes, the busiest one): CPU seconds between two readings; PostgreSQL not counted."""
    spent = [after[p] - before.get(p, 0.0) for p in after if p != -1]
    return sum(spent), max(spent, default=0.0)


def command_of(pid: int) -> str:
    """What a process of the tree is, in a few words (serve's children are told apart by their arguments)."""
    if pid == -1:
        return "PostgreSQL backends (not counted above)"
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return f"pid {pid}"
    words = [a.decode(errors="replace").rsplit("/", 1)[-1] for a in argv if a and not a.startswith(b"-")]
    return " ".join(words[:4])[:48]


def cpu_by_process(before: dict[int, float], after: dict[int, float], per: int) -> list[tuple[str, float]]:
    """Each process's CPU ms per request (``per`` requests) between two readings, busiest first."""
    spent = [(f"{command_of(p)} [{p}]", (after[p] - before.get(p, 0.0)) * 1000 / max(1, per)) for p in after]
    return sorted((s for s in spent if s[1] > 0), key=lambda s: -s[1])


WHERE: dict[str, list[tuple[str, float]]] = {}
"""The last size's server CPU per request, process by process, for each protocol phase (printed after its table)."""


MEMORY: list[tuple[str, float, float]] = []
"""The last size's processes with their RSS and PSS, largest first (printed after its table)."""


def tree_rss_mb(pid: int) -> list[tuple[str, float, float]]:
    """(command, VmRSS MB, Pss MB) of each process in the tree.

    The RSS of forked processes (Celery's pool, its beat) counts the pages
    they still share with their parent once in each; the PSS shares each such
    page out among the processes mapping it, so the PSS of the tree adds up to
    the memory it really holds.
    """
    out = []
    for p in tree(pid):
        try:
            status = dict(
                line.split(":", 1) for line in Path(f"/proc/{p}/status").read_text().splitlines() if ":" in line
            )
            rollup = dict(
                line.split(":", 1) for line in Path(f"/proc/{p}/smaps_rollup").read_text().splitlines() if ":" in line
            )
            cmd = Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:60]
        except OSError:
            continue
        # The pid and its parent's tell Celery's processes apart (its pool's children have the worker as
        # parent) and match the CPU figures, which name processes by pid.
        who = f"{cmd} [{p} of {status['PPid'].strip()}]"
        out.append((who, int(status["VmRSS"].split()[0]) / 1024, int(rollup["Pss"].split()[0]) / 1024))
    return out


def start_server(data: Path, admin_workers: int = 1) -> tuple[subprocess.Popen, str]:
    proc = start_serve(data, f"{PG}/{DB}", REDIS, settings={"LLMGW_ADMIN_WORKERS": str(admin_workers)})
    return proc, proc.admin


# ---------------------------------------------------------------- the protocol side


async def run_queue(host: str, port: int, requests: list, connections: int, on_answer, fresh: bool = False) -> None:
    """Send (kind, bytes, due) items from a list through ``connections`` keep-alive sockets.

    ``fresh``: each request on a connection of its own, closed once answered.
    """
    queue: asyncio.Queue = asyncio.Queue()
    for item in requests:
        queue.put_nowait(item)

    async def worker() -> None:
        conn = Connection(host, port)
        while not queue.empty():
            item = queue.get_nowait()
            try:
                on_answer(item, await conn.send(item[1]))
                if fresh:
                    conn.close()
            except (ConnectionError, OSError, asyncio.IncompleteReadError):
                on_answer(item, None)
                conn = Connection(host, port)

    await asyncio.gather(*(worker() for _ in range(connections)))


async def register(
    admin: str, join: str, sims: list, connections: int, pid: int, answered_at: dict[str, float], fresh: bool
) -> tuple[dict, list[str]]:
    host, port = admin.rsplit(":", 1)
    requests = [
        (
            sim.name,
            encode_post(
                admin,
                "/api/v1/agent/register",
                join,
                json.dumps({"name": sim.name, "machine_id": f"m-{sim.name}", "report": sim.report()}).encode(),
            ),
            0.0,
        )
        for sim in sims
    ]
    credentials: dict[str, str] = {}
    failed: list[str] = []

    def answered(item, answer) -> None:
        if answer is None or answer.status not in (200, 201):
            why = f"{answer.status} {answer.body[:200]!r}" if answer else "no answer"
            failed.append(f"{item[0]}: {why}")
        else:
            credentials[item[0]] = json.loads(answer.body)["credential"]
            answered_at[item[0]] = time.monotonic()

    cpu0, client0, t0 = tree_cpu(pid), time.process_time(), time.monotonic()
    await run_queue(host, int(port), requests, connections, answered, fresh)
    took = time.monotonic() - t0
    cpu1 = tree_cpu(pid)
    server, busiest = cpu_spent(cpu0, cpu1)
    WHERE["registration"] = cpu_by_process(cpu0, cpu1, len(sims))
    figures = {
        "register_s": took,
        "register_server_cpu_ms": server / len(sims) * 1000,
        "register_busiest_cpu_ms": busiest / len(sims) * 1000,
        "register_client_cpu_ms": (time.process_time() - client0) / len(sims) * 1000,
        "register_failed": len(failed),
    }
    creds = [credentials.get(s.name, "") for s in sims]
    if failed:
        print("  registration failures (first 3):", failed[:3])
    return figures, creds


async def heartbeats(admin: str, sims: list, creds: list[str], args, pid: int) -> dict:
    """The fleet's heartbeats (and unchanged full reports) for args.seconds, as bench/ingest.py drives them."""
    fleet = [(c, json.dumps(s.report()).encode()) for s, c in zip(sims, creds, strict=True) if c]
    beat_body = json.dumps({"load": {"cpu_percent": 12.5, "load1": 0.8}, "shards": []}).encode()
    beats = [encode_post(admin, "/api/v1/agent/heartbeat", c, beat_body) for c, _ in fleet]
    reports = [encode_post(admin, "/api/v1/agent/report", c, body) for c, body in fleet]
    n, every = len(fleet), max(1, round(args.report / args.heartbeat))

    async def drive(seconds: float):
        return await drive_fleet_as_told(admin, beats, reports, args, seconds)

    # The first heartbeat period after the registrations, apart: an admin process meets each node that
    # another registered once (one lookup), a cost of the storm's end and not of the steady state.
    first_cpu = None
    if args.warmup > 0:
        cpu0 = tree_cpu(pid)
        warm = await drive(args.warmup)
        first_answered = len(warm.samples["heartbeat"]) + len(warm.samples["report"])
        first_cpu = cpu_spent(cpu0, tree_cpu(pid))[0] / max(1, first_answered) * 1000
    cpu0, client0 = tree_cpu(pid), time.process_time()
    run = await drive(args.seconds)
    cpu1 = tree_cpu(pid)
    (server, busiest), client = cpu_spent(cpu0, cpu1), time.process_time() - client0
    samples, errors, elapsed = run.samples, run.errors, run.elapsed
    answered = len(samples["heartbeat"]) + len(samples["report"])
    WHERE["heartbeats and reports"] = cpu_by_process(cpu0, cpu1, answered)
    wanted = n / args.heartbeat * (1 - 1 / every)
    return {
        "hb_wanted_per_s": wanted,
        "hb_ratio": len(samples["heartbeat"]) / elapsed / wanted,
        "hb_p50_ms": pct(samples["heartbeat"], 50),
        "hb_p99_ms": pct(samples["heartbeat"], 99),
        "report_p99_ms": pct(samples["report"], 99),
        "hb_server_cpu_ms": server / max(1, answered) * 1000,
        "hb_first_cpu_ms": first_cpu,
        "hb_busiest_cpu_ms": busiest / max(1, answered) * 1000,
        "hb_server_cores": server / elapsed,
        "hb_client_cpu_ms": client / max(1, answered) * 1000,
        "hb_errors": sum(errors.values()),
    }


async def protocol_side(sims: list, args) -> dict:
    data = Path(tempfile.mkdtemp(prefix="llmgw-bench-scale-serve-"))
    proc, admin = start_server(data, args.admin_workers)
    try:
        join = (data / "join-token").read_text().strip()
        answered_at: dict[str, float] = {}
        # A fleet page open through it all: the registrations are the storm it hears (each is news to it).
        with LiveWatch(admin, data) as page:
            await asyncio.sleep(1)  # its socket open before the first registration
            figures, creds = await register(
                admin, join, sims, args.register_connections, proc.pid, answered_at, not args.register_keep_alive
            )
            if args.replicas_first:
                # The steady state of a fleet that serves: the reconciler reads the fleet every round from now on.
                figures["replicas"] = await asyncio.to_thread(place_replicas)
            if args.seconds > 0:
                figures.update(await heartbeats(admin, sims, creds, args, proc.pid))
            await asyncio.sleep(1.5)  # what the socket still holds
        figures.update(page.figures(answered_at))
        rss = tree_rss_mb(proc.pid)
        figures["serve_rss_mb"] = sum(r for _, r, _ in rss)
        figures["serve_pss_mb"] = sum(p for _, _, p in rss)
        figures["serve_rss_largest_mb"] = max(r for _, r, _ in rss)
        figures["serve_processes"] = len(rss)
        MEMORY[:] = sorted(rss, key=lambda r: -r[1])
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
    return figures


# ---------------------------------------------------------------- the read side (in-process)


def place_replicas() -> int:
    """A 2-GPU replica on every HGX node, as bench/api.py places them."""
    from catalog import writes as service
    from inventory.models import Node
    from placement.models import Replica, Shard

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
    hgx = list(Node.objects.filter(name__startswith="hgx-"))
    replicas = Replica.objects.bulk_create(
        Replica(
            model=model, profile=profile, profile_name="h100", profile_fingerprint=profile.fingerprint, state="ready"
        )
        for _ in hgx
    )
    Shard.objects.bulk_create(
        Shard(replica=r, node=n, rank=0, gpu_indices=[0, 1], state="ready") for r, n in zip(replicas, hgx, strict=True)
    )
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    return len(replicas)


def timed(fn, repeats: int) -> tuple[float, int]:
    """(p50 ms, queries of one more call)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    fn()  # warm
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append((time.perf_counter() - started) * 1000)
    with CaptureQueriesContext(connection) as seen:
        fn()
    return statistics.median(times), len(seen)


def read_side(args) -> dict:
    from asgiref.sync import async_to_sync
    from django.contrib.auth import get_user_model
    from django.test import AsyncClient, Client
    from django.utils import timezone
    from rest_framework.test import APIClient

    from core.models import ApiToken
    from observability import metrics, sweeps

    user = get_user_model().objects.create_superuser("bench-scale", "b@example.com", "x")
    _, secret = ApiToken.issue(user, "bench")
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    figures: dict = {}

    def get(client, path):
        def call():
            answer = client.get(path)
            assert answer.status_code == 200, (path, answer.status_code)
            return answer

        return call

    for path in READ_PATHS:
        if path != "/api/v1/nodes":
            figures[path] = timed(get(api, path), args.requests)

    # The node listing as the servers answer it, through Django's ASGI handler (it streams only
    # there); the chunks are counted as they come, not kept.
    async def listing() -> tuple[bool, int]:
        answer = await AsyncClient().get("/api/v1/nodes", headers={"Authorization": f"Bearer {secret}"})
        if not answer.streaming:
            return False, len(answer.content)
        size = 0
        async for chunk in answer.streaming_content:
            size += len(chunk)
        return True, size

    figures["/api/v1/nodes"] = timed(async_to_sync(listing), max(3, args.requests // 3))
    tracemalloc.start()
    figures["nodes_streamed"], size = async_to_sync(listing)()
    figures["nodes_peak_mb"] = tracemalloc.get_traced_memory()[1] / 1e6
    tracemalloc.stop()
    figures["nodes_mb"] = size / 1e6

    metrics.observe_reconcile(0.2)
    figures["/metrics"] = timed(metrics.exposition, max(3, args.requests // 3))
    figures["doctor sweep"] = timed(lambda: sweeps.sweep(timezone.now()), 3)
    console = Client()
    console.force_login(user)
    for path in PAGES:
        figures[path] = timed(get(console, path), max(3, args.requests // 3))
    return figures


# ---------------------------------------------------------------- the scheduler


def scheduler_figures(factor: int, seed: int) -> None:
    from bench import schedule as S
    from placement.scheduler import Planner

    rng = random.Random(seed)
    nodes = []
    for k in range(factor):
        for rack in range(40):
            nodes += [replace(n, name=f"{n.name}-x{k}") for n in S.nvl72(rack + 40 * k, rng)]
        nodes += [S.hgx(f"h100-{k}-{i:04d}", f"ib-{k}-{'east' if i < 1900 else 'west'}", rng) for i in range(3800)]
        nodes += [S.a100_mig(f"a100-{k}-{i:03d}", rng) for i in range(400)]
        nodes += [S.NodeInfo(name=f"cpu-{k}-{i:02d}", engines=S.ENGINES, memory_mb=512 << 10) for i in range(80)]
    models = [replace(m, name=f"{m.name}-{k}") for k in range(factor) for m in S.catalog(rng)]
    gpus = sum(len(n.gpus) for n in nodes)
    print(f"\nscheduler: {len(nodes)} nodes, {gpus} GPUs, {len(models)} models")
    empty = S.Snapshot(nodes=tuple(nodes), models=tuple(models), replicas=(), now=S.NOW)
    took, first = S.timed(empty, 1)
    print(f"  plan from empty:                 {took:7.3f} s  ({len(first.create)} replicas; target < 2 s)")
    placed = replace(empty, replicas=tuple(S.as_running(first)))
    took, _ = S.timed(placed, 1)
    print(f"  full re-plan, nothing changed:   {took:7.3f} s")
    busy = first.create[0].shards[0].node
    changed = replace(placed, nodes=tuple(replace(n, state="cordoned") if n.name == busy else n for n in nodes))
    took, again = S.timed(changed, 1)
    print(f"  full re-plan, one node cordoned: {took:7.3f} s  ({len(again.create)} new, {len(again.stop)} stops)")
    planner = Planner()
    planner.plan(placed)
    start = time.perf_counter()
    incremental = planner.plan(changed)
    took = time.perf_counter() - start
    print(
        f"  after one node cordoned, incremental: {took * 1000:5.1f} ms; same as full: {incremental == again} "
        f"(incremental: {planner.incremental}; target < 50 ms)"
    )


# ---------------------------------------------------------------- output


TARGETS = {
    "register_s": "< 60 s",
    "hb_ratio": "1.00",
    "hb_p99_ms": "< 250",
    "hb_server_cpu_ms": "<= 0.25",
    "/api/v1/summary": "< 100",
    "/api/v1/nodes": "< 1000, streamed",
    "/api/v1/nvlink": "< 300",
    "/api/v1/replicas": "< 300",
    "/metrics": "< 1000",
    "doctor sweep": "< 2000",
    "/admin/fleet/": "< 500",
    "/admin/nodes/": "< 500 paginated",
    "/admin/nvlink/": "< 1000 (rack page)",
    "live_frames_max_per_s": "a few",
    "live_late_max_ms": "< 1000",
    "serve_rss_mb": "< 1024",
}

ROWS = (
    ("register_s", "registration of the fleet, s", "{:.1f}"),
    ("register_server_cpu_ms", "  server CPU per registration (all processes), ms", "{:.1f}"),
    ("register_busiest_cpu_ms", "    of which its busiest process, ms", "{:.1f}"),
    ("register_client_cpu_ms", "  load generator CPU per registration, ms", "{:.2f}"),
    ("register_failed", "  registrations refused", "{}"),
    ("hb_wanted_per_s", "heartbeats the fleet sends, /s", "{:.0f}"),
    ("hb_ratio", "  held ratio", "{:.2f}"),
    ("hb_p50_ms", "  p50, ms", "{:.1f}"),
    ("hb_p99_ms", "  p99, ms", "{:.1f}"),
    ("report_p99_ms", "  unchanged full report p99, ms", "{:.1f}"),
    ("hb_server_cpu_ms", "  server CPU per request (all processes), ms", "{:.2f}"),
    ("hb_busiest_cpu_ms", "    of which its busiest process, ms", "{:.2f}"),
    ("hb_first_cpu_ms", "  the same in the first period, not counted above, ms", "{:.2f}"),
    ("hb_server_cores", "  server cores busy", "{:.2f}"),
    ("hb_client_cpu_ms", "  load generator CPU per request, ms", "{:.3f}"),
    ("hb_errors", "  errors", "{}"),
    ("/api/v1/summary", "/api/v1/summary p50 ms (queries)", None),
    ("/api/v1/nodes", "/api/v1/nodes p50 ms (queries)", None),
    ("nodes_mb", "  its size, MB", "{:.2f}"),
    ("nodes_streamed", "  streamed", "{}"),
    ("nodes_peak_mb", "  peak Python memory, MB", "{:.0f}"),
    ("/api/v1/nvlink", "/api/v1/nvlink p50 ms (queries)", None),
    ("/api/v1/replicas", "/api/v1/replicas p50 ms (queries)", None),
    ("/metrics", "/metrics scrape ms (queries)", None),
    ("doctor sweep", "doctor sweep ms (queries)", None),
    ("/admin/fleet/", "console fleet page ms (queries)", None),
    ("/admin/nodes/", "console nodes page ms (queries)", None),
    ("/admin/nvlink/", "console NVLink rack page ms (queries)", None),
    ("live_frames_max_per_s", "live fleet page: frames in its busiest second", "{}"),
    ("live_late_p99_ms", "  a registration reaching it, p99 ms", "{:.0f}"),
    ("live_late_max_ms", "  the latest, ms", "{:.0f}"),
    ("live_frames", "  frames in all (of them resyncs)", None),
    ("live_never_told", "  registrations it never heard of", "{}"),
    ("live_reconnects", "  its socket closed and opened again", "{}"),
    ("serve_rss_mb", "llmgw serve RSS, all processes, MB", "{:.0f}"),
    ("serve_pss_mb", "  PSS, all processes (shared pages counted once), MB", "{:.0f}"),
    ("serve_rss_largest_mb", "  its largest process, MB", "{:.0f}"),
    ("serve_processes", "  processes", "{}"),
)


def print_table(results: dict[int, dict]) -> None:
    sizes = sorted(results)
    print(f"\n{'figure':<50}" + "".join(f"{s:>14,}" for s in sizes) + "   target at 10,000")
    for key, label, fmt in ROWS:
        cells = []
        for s in sizes:
            value = results[s].get(key)
            if value is None:
                cells.append("-")
            elif fmt is None:
                cells.append(f"{value[0]:.0f} ({value[1]})")
            else:
                cells.append(fmt.format(value))
        print(f"{label:<50}" + "".join(f"{c:>14}" for c in cells) + f"   {TARGETS.get(key, '')}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="2000,5000,10000")
    parser.add_argument("--seconds", type=float, default=30, help="heartbeat drive per size; 0 skips it")
    parser.add_argument("--heartbeat", type=float, default=5.0)
    parser.add_argument(
        "--warmup",
        type=float,
        default=None,
        help="seconds of heartbeats before those measured, their CPU apart (default: one heartbeat period)",
    )
    parser.add_argument("--report", type=float, default=60.0)
    parser.add_argument("--connections", type=int, default=32, help="sockets the heartbeats use")
    # The PostgreSQL here is shared: each concurrent registration holds a connection in the server's thread pool.
    parser.add_argument("--register-connections", type=int, default=6)
    parser.add_argument(
        "--register-keep-alive",
        action="store_true",
        help="registrations over the --register-connections sockets kept open, not a connection each",
    )
    parser.add_argument(
        "--admin-workers",
        type=int,
        default=2,
        help="LLMGW_ADMIN_WORKERS: processes serving the admin listener (2: one a core here)",
    )
    parser.add_argument("--requests", type=int, default=10, help="timed requests per read path")
    parser.add_argument("--scheduler-factor", type=int, default=4, help="bench/schedule.py's 5,000 nodes times this")
    parser.add_argument("--no-scheduler", action="store_true")
    parser.add_argument(
        "--replicas-first",
        action="store_true",
        help="place the replicas once the fleet has registered, before its heartbeats: the reconciler then reads the"
        " fleet every round, as it does on a control host whose catalog has a model",
    )
    parser.add_argument("--no-read-side", action="store_true", help="only the protocol side: registration, heartbeats")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep-db", metavar="NAME", help="keep each size's registered fleet as database NAME_<size>")
    parser.add_argument(
        "--read-only-from", metavar="NAME", help="measure only the read side, on a copy of NAME_<size> (--keep-db's)"
    )
    args = parser.parse_args()
    if args.warmup is None:
        args.warmup = args.heartbeat
    setup_django()
    from agent.simulator.fleet import build_fleet

    results: dict[int, dict] = {}
    for size in (int(s) for s in args.sizes.split(",")):
        started = time.monotonic()
        if args.read_only_from:
            fresh_database(f"{args.read_only_from}_{size}")
            from django.core.management import call_command

            call_command("migrate", verbosity=0)  # a fleet kept before a later migration gets it
            print(f"== {size:,} nodes, read side only, on a copy of {args.read_only_from}_{size}", flush=True)
            results[size] = {}
        else:
            fresh_database()
            sims = build_fleet(spec_for(size))
            print(f"== {len(sims):,} nodes ({spec_for(size)})", flush=True)
            results[size] = asyncio.run(protocol_side(sims, args))
            if not args.no_read_side and not args.replicas_first:
                results[size]["replicas"] = place_replicas()
                if args.keep_db:
                    keep_database(f"{args.keep_db}_{size}")
        if not args.no_read_side:
            results[size].update(read_side(args))
        print(f"   done in {time.monotonic() - started:.0f} s", flush=True)
        print_table({size: results[size]})
        for why in results[size].get("live_closes", []):
            print(f"  the live page's socket closed: {why}")
        for phase, rows in WHERE.items():
            print(f"  server CPU per request in {phase}, ms, by process:")
            for name, ms in rows:
                print(f"    {ms:8.3f}  {name}")
        WHERE.clear()
        if MEMORY:
            print("  llmgw serve's processes after the protocol side, RSS (PSS) MB:")
            for command, rss_mb, pss_mb in MEMORY:
                print(f"    {rss_mb:6.0f} ({pss_mb:4.0f})  {command}")
            MEMORY.clear()
    if len(results) > 1:
        print_table(results)
    if not args.no_scheduler:
        scheduler_figures(args.scheduler_factor, args.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
