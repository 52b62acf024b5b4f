"""The kept snapshot reader and shard table on SQLite, the embedded default: fingerprints from SQLite's functions.

SQLite has no ``ROW(...)::text``, no ``sha256`` of its own (Django registers
one) and, before 3.44, no ordered aggregate, so each fingerprint is built
another way there (``core.fingerprints``). The suite runs on PostgreSQL;
this runs rounds of changes through a kept reader in a process of its own on
a migrated SQLite file, each checked against a new reader's snapshot.
"""

from __future__ import annotations

from tests import onsqlite

CHECK = """
from django.utils import timezone
from placement import snapshot
from tests.placement import test_snapshot_kept as T
model, first, wide = T.served_fleet()
now = timezone.now()
reader = snapshot.FleetReader()
before = T.same(reader, now)
again = T.same(reader, now)
assert all(a is b for a, b in zip(again.snapshot.nodes, before.snapshot.nodes, strict=True)), "nothing rebuilt"
assert all(a is b for a, b in zip(again.snapshot.replicas, before.snapshot.replicas, strict=True))
steps = 0
for kind, targets, whats in (
    ("node", T.NODES, [*sorted(T.NODE_CHANGES), "lost"]),
    ("card", T.NODES, [*sorted(T.GPU_CHANGES), "delete"]),
    ("hold", T.NODES[:3], [0, 2]),
    ("replica", [0, 1, 2], ["state", "used", "shard", "delete"]),
    ("place", T.NODES[:2], [5]),
):
    for target in targets:
        for what in whats:
            T.apply((kind, target, what), model, now)
            T.same(reader, now)
            steps += 1
from inventory.models import Node
for imex in (None, [], T.JSON_NULL, "", [0], "0"):  # NULL, JSON null, an empty text: three values
    Node.objects.filter(name="cpu-00").update(imex_channels=imex)
    T.same(reader, now)
    steps += 1
print("rounds", steps)
"""


def test_a_kept_reader_on_sqlite_gives_a_new_readers_snapshot(tmp_path):
    out = onsqlite.run(CHECK, tmp_path)
    assert "rounds 180" in out, out


SHARDS = """
from placement import assignments
from tests.placement.test_assignments_rows import placed_fleet
from tests.placement.test_assignments_kept import CHANGES, same
placed_fleet()
kept = assignments.KeptTable()
table = same(kept)
assert same(kept) is table
from django.db import transaction
for name in sorted(CHANGES):
    before = same(kept)
    with transaction.atomic():  # each change alone, on the fleet as placed, then undone
        CHANGES[name]()
        assert same(kept) != before, name
        transaction.set_rollback(True)
    assert same(kept) == before
print("changes", len(CHANGES))
"""


def test_the_kept_shard_table_on_sqlite_is_the_table_read_afresh(tmp_path):
    out = onsqlite.run(SHARDS, tmp_path)
    assert "changes 22" in out, out
