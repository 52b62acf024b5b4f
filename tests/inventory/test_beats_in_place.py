"""A heartbeat rewrites its node's row in the row's own page and writes no index entry (migration 0014).

At 10,000 nodes the flusher writes 2,000 node rows a second. When each write
was a new row version elsewhere plus an entry in all nine of the table's
indexes, the node table grew to eight times its live rows between vacuums,
and every read of the fleet scanned that. Here a fleet of nodes as wide as
real ones (their disks, fabrics, engines and digests) beats as a real fleet
does, a fifth of it each flush, each flush its own transaction; every row a
flush writes must be a heap-only (HOT) update: with last_seen indexed none
are, and with full pages (fillfactor 100) the first flushes' are not.
"""

from __future__ import annotations

import time

import pytest
from django.db import connection, transaction
from django.utils import timezone

from inventory.models import Node
from inventory.writes.heartbeats import HeartbeatDesk

pytestmark = pytest.mark.django_db(transaction=True)

NODES = 300
ROUNDS = 10


def wide_node(i: int) -> Node:
    """A node with columns about as wide as a registered HGX box's (bench/scale.py measured ~730 bytes)."""
    return Node(
        name=f"hgx-{i:04d}",
        hostname=f"hgx-{i:04d}.cluster.example.com",
        mgmt_addr=f"10.0.{i // 250}.{i % 250}",
        agent_version="0.9.0",
        os="Ubuntu",
        os_version="22.04.4 LTS",
        arch="x86_64",
        cpu_flags=["avx2", "avx512f", "amx_tile"],
        memory_mb=2_000_000,
        engines={"vllm": "0.6.3", "sglang": "0.3.5"},
        disks=[
            {"path": "/models", "total_gb": 7000, "free_gb": 6100, "shared": False},
            {"path": "/scratch", "total_gb": 3500, "free_gb": 3400, "shared": False},
        ],
        fabrics={"north": ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]},
        load={"cpu_percent": 3.5, "load1": 0.4, "memory_used_mb": 81234, "memory_total_mb": 2063000},
        credential_digest=f"{i:064x}",
        report_digest=f"{i + 1:064x}",
        machine_id=f"{i:032x}",
        last_seen=timezone.now(),
    )


def updates_so_far() -> tuple[int, int]:
    """(row updates, of them heap-only) of inventory_node this connection has not yet reported to the statistics.

    PostgreSQL's xact view counts what the backend holds for its next report,
    which may include transactions before this one: compare two readings.
    """
    with connection.cursor() as cur:
        cur.execute(
            "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_xact_user_tables WHERE relname = %s",
            [Node._meta.db_table],
        )
        return cur.fetchone()


def others_holding_snapshots() -> list[str]:
    """What other sessions on this database hold a snapshot now (their xmin), each as its state and query.

    A row version a flush leaves behind can be pruned from its page, making
    room for the next lap's, only once no transaction could still see it. A
    session of an earlier test that has not let go (a live server shutting
    down, an autovacuum ANALYZE) keeps every version, and the second lap
    finds the pages full: not the code's doing, and said so by this list.
    """
    with connection.cursor() as cur:
        cur.execute(
            "SELECT coalesce(backend_type, '') || ' ' || coalesce(state, '') || ': ' || left(query, 80)"
            " FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
            " AND backend_xmin IS NOT NULL"
        )
        return [row[0] for row in cur.fetchall()]


def test_every_heartbeat_is_written_in_its_rows_own_page_with_no_index_entry():
    # A session left from an earlier test may take a moment to close: wait for it (a bounded wait, no retry).
    deadline = time.monotonic() + 30
    while (holding := others_holding_snapshots()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not holding, f"other sessions hold snapshots, so no page can be pruned: {holding}"
    nodes = Node.objects.bulk_create(wide_node(i) for i in range(NODES))
    desk = HeartbeatDesk()
    for node in nodes:
        desk.remember(node)
    refs = [desk.nodes[n.credential_digest] for n in nodes]
    fifth = NODES // 5
    seen = []
    for round_ in range(ROUNDS):
        at = timezone.now()
        # A fifth of the fleet a flush, in turn, as beats every 5 s flushed every second fall.
        start = (round_ % 5) * fifth
        for ref in refs[start : start + fifth]:
            desk.accept(ref, {"load": {"cpu_percent": float(round_), "load1": 0.5, "memory_used_mb": 80000}}, at)
        with transaction.atomic():
            before = updates_so_far()
            assert desk.flush().written == fifth
            after = updates_so_far()
        seen.append((after[0] - before[0], after[1] - before[1]))
    assert seen == [(fifth, fifth)] * ROUNDS, (
        f"(rows written, of them in place) per flush; sessions holding snapshots now: {others_holding_snapshots()}"
    )
