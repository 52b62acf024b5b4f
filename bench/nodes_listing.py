"""The full node listing alone (``GET /api/v1/nodes``), timed as bench/scale.py's read side times it.

For iterating on the listing without the minutes bench/scale.py takes: the
same request through Django's ASGI handler (``AsyncClient``, the streamed
chunks consumed as they come), on a database that already holds a fleet
(a copy of a kept one, say ``CREATE DATABASE mine TEMPLATE s28_fleet_10000``).

    python bench/nodes_listing.py --db mine --requests 5
    python bench/nodes_listing.py --db mine --profile /tmp/nodes.prof   # cProfile of one request
    python bench/nodes_listing.py --db mine --dump /tmp/nodes.json      # the bytes, at a fixed now

``--dump`` writes the listing's bytes as built at one fixed moment, so two
versions of the code can be compared byte for byte on the same fleet.
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import statistics
import sys
import time
import tracemalloc
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import djangodb

PG = "postgresql://postgres@127.0.0.1:5432"
# The moment --dump lists the fleet at: ages and fresh loads depend on it.
FIXED_NOW = "2026-12-03T09:00:00+00:00"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", required=True, help="a database holding a fleet (not modified but for a token)")
    parser.add_argument("--requests", type=int, default=5)
    parser.add_argument("--path", default="/api/v1/nodes")
    parser.add_argument("--profile", metavar="FILE", help="cProfile one request into FILE")
    parser.add_argument("--dump", metavar="FILE", help="write the listing's bytes at a fixed now into FILE")
    parser.add_argument("--page", type=int, help="nodes a page (inventory.reads.nodes.NODE_PAGE)")
    args = parser.parse_args()
    djangodb.setup_django(f"{PG}/{args.db}", "llmgw-bench-nodes-")
    if args.page:
        from inventory.reads import nodes as listing

        listing.NODE_PAGE = args.page

    from asgiref.sync import async_to_sync
    from django.contrib.auth import get_user_model
    from django.test import AsyncClient

    from api import base
    from core.models import ApiToken
    from inventory.models import Node
    from placement import reads

    if args.dump:
        now = datetime.fromisoformat(FIXED_NOW)
        if hasattr(reads, "node_pages_json"):  # the listing as the API builds it now
            data = b"".join(base._array_chunks(reads.node_pages_json(base.dumps, now=now), encoded=True))
        else:  # as it was built before node_pages_json
            data = b"".join(base._array_chunks(reads.node_pages(now=now, wiring=True)))
        Path(args.dump).write_bytes(data)
        print(f"{len(data) / 1e6:.2f} MB sha256 {hashlib.sha256(data).hexdigest()[:16]}")
        return 0

    user, _ = get_user_model().objects.get_or_create(username="bench-nodes")
    _, secret = ApiToken.issue(user, "bench")

    async def listing() -> int:
        answer = await AsyncClient().get(args.path, headers={"Authorization": f"Bearer {secret}"})
        assert answer.status_code == 200 and answer.streaming, answer.status_code
        size = 0
        async for chunk in answer.streaming_content:
            size += len(chunk)
        return size

    call = async_to_sync(listing)
    size = call()  # warm
    if args.profile:
        profiler = cProfile.Profile()
        profiler.enable()
        call()
        profiler.disable()
        profiler.dump_stats(args.profile)
    times, cpu, database = [], [], []
    for _ in range(args.requests):
        started, used, served = time.perf_counter(), time.process_time(), backend_cpu(args.db)
        call()
        times.append((time.perf_counter() - started) * 1000)
        cpu.append((time.process_time() - used) * 1000)
        database.append((backend_cpu(args.db) - served) * 1000)
    tracemalloc.start()
    call()
    peak = tracemalloc.get_traced_memory()[1] / 1e6
    tracemalloc.stop()
    print(
        f"{Node.objects.count()} nodes, {size / 1e6:.2f} MB: p50 {statistics.median(times):.0f} ms "
        f"(min {min(times):.0f}, max {max(times):.0f}, {len(times)} requests), peak {peak:.1f} MB; "
        f"CPU p50: this process {statistics.median(cpu):.0f} ms, PostgreSQL {statistics.median(database):.0f} ms"
    )
    return 0


def backend_cpu(db: str) -> float:
    """CPU seconds of the PostgreSQL backends connected to ``db`` (bench/scale.py's reading)."""
    from bench import scale

    scale.DB = db
    return scale.database_cpu()


if __name__ == "__main__":
    sys.exit(main())
