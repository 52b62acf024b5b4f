"""The trigger's recount finds a node's rows by index however small its table was when a connection first ran it.

PL/pgSQL keeps a generic plan after a function's fifth call when it looks no
dearer than the custom ones; kept while inventory_nodedevices was nearly
empty, it scanned the whole table for each node's rows from then on, and a
fleet's registrations cost PostgreSQL time in the square of its size
(migration 0013). Here a connection warms the function on a near-empty
table, the table grows, and one more recount must read no more rows of it
than a node's own.
"""

from __future__ import annotations

import pytest
from django.db import connection

from inventory.models import GPU, Node, NodeDevices

pytestmark = pytest.mark.django_db

GROWN_TO = 3000


def rows_scanned() -> int:
    """inventory_nodedevices' rows read by sequential scans in this transaction, so far."""
    with connection.cursor() as cur:
        table = NodeDevices._meta.db_table
        cur.execute("SELECT seq_tup_read FROM pg_stat_xact_user_tables WHERE relname = %s", [table])
        (read,) = cur.fetchone()
    return read


def recount(node_id: int) -> None:
    with connection.cursor() as cur:
        cur.execute("SELECT inventory_recount_devices(ARRAY[%s]::bigint[])", [node_id])


def test_a_recount_reads_one_nodes_rows_after_the_table_grew():
    node = Node.objects.create(name="first", machine_id="m-first")
    GPU.objects.bulk_create(GPU(node=node, index=i, gpu_class="h100-80g") for i in range(8))
    for _ in range(12):  # past the five custom plans after which PL/pgSQL may keep a generic one
        recount(node.pk)
    others = Node.objects.bulk_create(Node(name=f"n{i:05d}", machine_id=f"m{i}") for i in range(GROWN_TO))
    NodeDevices.objects.bulk_create(
        NodeDevices(node=n, gpu_class="h100-80g", total=8, unhealthy=0, held=0, open=8, open_bits=255) for n in others
    )
    before = rows_scanned()
    recount(node.pk)
    assert rows_scanned() - before < GROWN_TO / 10, "the recount scanned the whole table for one node's rows"
    assert NodeDevices.objects.filter(node=node).values_list("total", flat=True).get() == 8
