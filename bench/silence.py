"""A fleet falling silent at once, and coming back: the control plane's CPU in the passes that follow.

For each size (``--sizes``), a fleet is stored through the real ingestion in
a PostgreSQL database of its own, ``<DB>_<size>_built`` (``LLMGW_BENCH_DB``,
default ``llmgw_bench_silence``; kept between runs unless ``--rebuild``): a
hundredth of it GB200 NVL72 racks (18 trays, one NVLink domain each), the rest
8-GPU HGX nodes on two InfiniBand fabrics (``north`` 60 %, ``south`` 40 %),
labelled ``rack`` in racks of 18, with ten models filling about two thirds of
it. Each case runs on a fresh copy of that database (``CREATE DATABASE ...
TEMPLATE``), in a process of its own:

- ``fleet``: every node's heartbeats stopped ten minutes before the first
  sweep (a partition between the fleet and the control host);
- ``south``: the whole of fabric ``south`` (40 % of the fleet) silent: a
  partition of the fabric, of its racks too.

Then, 5 s apart as in production: the reachability sweep (and the receivers of
``reachability_changed`` it is followed by), the reconcile, the doctor's sweep;
a second such pass; then every node beats again (the heartbeat desk's flush,
its ``came_back`` path and the receivers of ``heartbeats_flushed`` and
``nodes_came_back``), and the sweep, reconcile and doctor's sweep after that.
Printed per step: CPU seconds of this process (``time.process_time``: the
machine may be shared; the database server's own CPU is not in it) and the
queries run. ``--profile STEP`` prints a cProfile of that step (e.g.
``sweep-1``), the 25 costliest functions by cumulative time.

    LLMGW_BENCH_DB=h1_bench_silence python bench/silence.py --sizes 2000,5000,10000
    python bench/silence.py --sizes 10000 --cases fleet --profile sweep-1

``--drop`` drops every database of this benchmark (``<DB>_*``) and exits.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

PG = "postgresql://postgres@127.0.0.1:5432"
DB = os.environ.get("LLMGW_BENCH_DB", "llmgw_bench_silence")
RACK = 18
SILENT_FOR = timedelta(minutes=10)


def admin(*statements: str) -> list:
    with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
        out = []
        for statement in statements:
            cur = conn.execute(statement)
            out.append(cur.fetchall() if cur.description else None)
        return out


def exists(name: str) -> bool:
    return bool(admin(f"SELECT 1 FROM pg_database WHERE datname = '{name}'")[0])


def setup_django(name: str) -> None:
    os.environ.update(
        LLMGW_DATA_DIR=tempfile.mkdtemp(prefix="llmgw-bench-silence-"),
        LLMGW_DATABASE_URL=f"{PG}/{name}",
        DJANGO_SETTINGS_MODULE="llmgw.settings",
        LLMGW_HEARTBEAT_FLUSHER="manual",
    )
    os.environ.pop("LLMGW_REDIS_URL", None)
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def spec_for(nodes: int) -> str:
    racks = max(1, nodes // 100 // RACK)
    hgx = nodes - racks * RACK
    north = hgx * 3 // 5
    return f"gb200-nvl72:{racks}@gb,h100-hgx:{north}@north,h100-hgx:{hgx - north}@south"


def build(nodes: int) -> None:
    """Store the fleet, label its racks, add the models and place them."""
    from django.utils import timezone

    from agent.simulator.fleet import build_fleet
    from catalog import writes as service
    from inventory.models import Node
    from inventory.writes.ingest import ingest_report
    from placement.writes.reconciler import reconcile

    now = timezone.now()
    sims = build_fleet(spec_for(nodes))
    rows = Node.objects.bulk_create(Node(name=s.name, last_seen=now) for s in sims)
    for node, sim in zip(rows, sims, strict=True):
        ingest_report(node, sim.report(), now)
    by_rack: dict[str, list[str]] = {}
    hgx = [s.name for s in sims if s.rack is None]
    for i, name in enumerate(hgx):
        by_rack.setdefault(f"r{i // RACK:04d}", []).append(name)
    for s in sims:
        if s.rack is not None:
            by_rack.setdefault(s.rack, []).append(s.name)
    for label, members in by_rack.items():
        Node.objects.filter(name__in=members).update(labels={"rack": label})
    per_model = max(1, len(hgx) * 2 // 3 // 10)
    for m in range(10):
        profile = {"name": "gpu", "engine": "vllm", "gpu_class": "h100-80g", "gpus": 8, "nodes": 1, "tp": 8, "pp": 1}
        scaling = {"min": per_model, "max": per_model}
        service.add_model({"name": f"model-{m}", "scaling": scaling, "profiles": [profile]}, actor="bench")
    reconcile(now)


class Steps:
    """Each step's CPU seconds and queries, and the profile of the one asked for."""

    def __init__(self, profile: str | None) -> None:
        self.rows: list[dict] = []
        self.profile = profile

    def run(self, name: str, fn, *args, **kwargs):
        from django.db import connection
        from django.test.utils import CaptureQueriesContext

        prof = cProfile.Profile() if name == self.profile else None
        with CaptureQueriesContext(connection) as queries:
            cpu = time.process_time()
            if prof:
                prof.enable()
            out = fn(*args, **kwargs)
            if prof:
                prof.disable()
            cpu = time.process_time() - cpu
        self.rows.append({"step": name, "cpu_s": round(cpu, 3), "queries": len(queries)})
        if prof:
            text = io.StringIO()
            pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(25)
            print(text.getvalue(), file=sys.stderr, flush=True)
        return out


def one_case(case: str, size: int, profile: str | None) -> None:
    """Run one case on a fresh copy of the built fleet; print its steps as one JSON line."""
    work = f"{DB}_{size}_{case}"
    admin(f"DROP DATABASE IF EXISTS {work} WITH (FORCE)", f"CREATE DATABASE {work} TEMPLATE {DB}_{size}_built")
    setup_django(work)
    from django.db.models import F
    from django.utils import timezone

    from inventory import reachability, signals
    from inventory.loss_settings import loss_rules
    from inventory.models import FleetEvent, Node
    from inventory.writes import heartbeats
    from observability import sweeps
    from placement import signals as placement_signals
    from placement.writes.reconciler import reconcile

    # No broker here: a reconcile asked for is counted, not queued (the bench runs them by hand).
    asked = []
    placement_signals._coalescer.send = asked.append

    t0 = timezone.now()
    stopped = t0 - SILENT_FOR
    nodes = list(Node.objects.order_by("pk").values_list("pk", "name", "report_digest", "credential_digest", "labels"))
    silent = [pk for pk, *_ in nodes] if case == "fleet" else sorted(_south_pks())
    # Every node answering at t0 but the silent ones.
    Node.objects.update(last_seen=t0, reachable=True, lost=False, unreachable_since=None)
    # Each its own last beat, spread over the 5 s before the silence (a heartbeat's interval): as on a real fleet,
    # no two silences start at the same microsecond.
    spread = timedelta(seconds=5) / max(1, len(nodes))
    Node.objects.filter(pk__in=silent).update(last_seen=stopped - (F("pk") % len(nodes)) * spread)
    rules = loss_rules()
    steps = Steps(profile)

    def alive(now) -> None:
        Node.objects.exclude(pk__in=silent).update(last_seen=now)

    def sweep(now):
        result = reachability.sweep(now, rules=rules)
        if result.changed:
            signals.reachability_changed.send(sender=Node, result=result)
        return result

    summary = {}
    for n, now in enumerate((t0, t0 + timedelta(seconds=5)), start=1):
        alive(now)
        result = steps.run(f"sweep-{n}", sweep, now)
        summary[f"sweep-{n}"] = {k: len(v) for k, v in vars(result).items() if isinstance(v, list)}
        steps.run(f"reconcile-{n}", reconcile, now)
        steps.run(f"doctor-{n}", sweeps.sweep, now)

    back = t0 + timedelta(seconds=10)
    refs = [heartbeats.NodeRef(pk, name, digest, cred, time.monotonic()) for pk, name, digest, cred, _ in nodes]
    for ref in refs:
        heartbeats.desk.accept(ref, {"load": {}}, back)

    def flush():
        result = heartbeats.desk.flush()
        signals.nodes_came_back.send(sender=Node, nodes=result.came_back)
        return result

    flushed = steps.run("flush-back", flush)
    summary["flush-back"] = {"written": flushed.written, "came_back": len(flushed.came_back)}
    now = back + timedelta(seconds=5)
    result = steps.run("sweep-back", sweep, now)
    summary["sweep-back"] = {k: len(v) for k, v in vars(result).items() if isinstance(v, list) and v}
    steps.run("reconcile-back", reconcile, now)
    steps.run("doctor-back", sweeps.sweep, now)
    summary["events"] = FleetEvent.objects.count()
    print(json.dumps({"case": case, "nodes": len(nodes), "silent": len(silent), "steps": steps.rows, **summary}))
    from django.db import connections

    connections.close_all()
    admin(f"DROP DATABASE IF EXISTS {work} WITH (FORCE)")


def _south_pks() -> set[int]:
    """The nodes on fabric ``south``, as the sweep's groups see them."""
    from inventory.models import Node
    from inventory.writes import partitions

    names = partitions.groups(()).get("fabric south", set())
    return set(Node.objects.filter(name__in=names).values_list("pk", flat=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="2000,5000,10000")
    parser.add_argument("--cases", default="fleet,south")
    parser.add_argument("--rebuild", action="store_true", help="build the fleets again even where kept")
    parser.add_argument("--profile", help="print a cProfile of this step (sweep-1, reconcile-1, flush-back, ...)")
    parser.add_argument("--drop", action="store_true", help="drop this benchmark's databases and exit")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--build", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.drop:
        for (name,) in admin(f"SELECT datname FROM pg_database WHERE datname LIKE '{DB}\\_%'")[0]:
            admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
            print("dropped", name)
        return
    if args.build:
        setup_django(f"{DB}_{args.build}_built")
        build(args.build)
        return
    if args.one:
        case, size = args.one.split(":")
        one_case(case, int(size), args.profile)
        return
    for size in (int(s) for s in args.sizes.split(",")):
        built = f"{DB}_{size}_built"
        if args.rebuild or not exists(built):
            admin(f"DROP DATABASE IF EXISTS {built} WITH (FORCE)", f"CREATE DATABASE {built}")
            started = time.perf_counter()
            subprocess.run([sys.executable, __file__, "--build", str(size)], check=True)
            print(f"# built {size} nodes in {time.perf_counter() - started:.0f} s", flush=True)
        for case in args.cases.split(","):
            extra = ["--profile", args.profile] if args.profile else []
            subprocess.run([sys.executable, __file__, "--one", f"{case}:{size}", *extra], check=True)


if __name__ == "__main__":
    main()
