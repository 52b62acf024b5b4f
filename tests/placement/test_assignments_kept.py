"""The heartbeat desk's table of shards, kept between reloads, is always what reading it afresh gives.

``placement.assignments.KeptTable`` hands out the table it holds while the
database's fingerprints of the rows it was made from are unchanged. What
could go wrong: a column the table shows that the fingerprint does not follow
(an agent would never hear of the change), a fingerprint kept from another
statement than the rows, an adapter or profile that changes beside them.
"""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from catalog.models import Adapter, CatalogModel, Profile
from inventory.models import Node
from placement import assignments
from placement.models import Replica, ReplicaState, Shard
from tests.api.fleet import place
from tests.placement.test_assignments_rows import placed  # noqa: F401 - the fixture

pytestmark = pytest.mark.django_db


def same(kept: assignments.KeptTable) -> dict:
    table = kept.table()
    assert table == assignments.for_nodes()
    return table


def first_replica() -> Replica:
    """A running replica with a profile; which one follows the random ids, so that runs differ: one shard or two."""
    return Replica.objects.exclude(state=ReplicaState.STOPPING).exclude(profile=None).order_by("id").first()


# Each change touches one thing the table shows (or decides what it shows), and must reach it.
CHANGES = {
    "gpus": lambda: Shard.objects.filter(replica=first_replica()).update(gpu_indices=[5]),
    "env": lambda: Shard.objects.filter(replica=first_replica()).update(env={"X": "1"}),
    "rank": lambda: Shard.objects.filter(replica=first_replica(), rank=0).update(rank=3),
    "node": lambda: Shard.objects.filter(replica=first_replica()).update(node=Node.objects.get(name="hgx-002")),
    "stopping": lambda: Replica.objects.filter(pk=first_replica().pk).update(state=ReplicaState.STOPPING),
    "back from stopping": lambda: Replica.objects.filter(state=ReplicaState.STOPPING).update(state="ready"),
    "engine key": lambda: Replica.objects.filter(pk=first_replica().pk).update(engine_key="k" * 32),
    "model name": lambda: CatalogModel.objects.filter(pk=first_replica().model_id).update(name="renamed"),
    "model source": lambda: CatalogModel.objects.filter(pk=first_replica().model_id).update(source="hf://a/b"),
    "engine": lambda: Profile.objects.filter(pk=first_replica().profile_id).update(engine="llamacpp"),
    "engine args": lambda: Profile.objects.filter(pk=first_replica().profile_id).update(engine_args=["--x"]),
    "tp": lambda: Profile.objects.filter(pk=first_replica().profile_id).update(tp=4),
    "pp": lambda: Profile.objects.filter(pk=first_replica().profile_id).update(pp=2),
    "nodes": lambda: Profile.objects.filter(pk=first_replica().profile_id).update(nodes=2),
    "profile removed": lambda: Replica.objects.filter(pk=first_replica().pk).update(profile=None),
    "adapter added": lambda: Adapter.objects.create(model_id=first_replica().model_id, name="new", source="x"),
    "adapter source": lambda: Adapter.objects.update(source="hf://acme/other"),
    "adapter renamed": lambda: Adapter.objects.filter(name="llama-sql").update(name="llama-aaa"),
    "adapter removed": lambda: Adapter.objects.filter(name="llama-chat").delete(),
    "shard removed": lambda: Shard.objects.filter(replica=first_replica()).delete(),
    "replica removed": lambda: Replica.objects.filter(pk=first_replica().pk).delete(),
    "nothing left": lambda: Replica.objects.all().delete(),
}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_each_change_reaches_the_table_and_nothing_else_rebuilds_it(placed, change):  # noqa: F811
    kept = assignments.KeptTable()
    before = same(kept)
    assert same(kept) is before, "nothing changed: the very table"
    CHANGES[change]()
    after = same(kept)
    assert after != before
    assert same(kept) is after


def test_a_change_between_the_fingerprints_and_the_rows_is_not_kept_under_the_old_fingerprint(placed, monkeypatch):  # noqa: F811
    """The rows change (A to B), the reader sees B's fingerprint, and they change again (C) before they are read.

    Kept under B's fingerprint, C's table would be handed out when the rows go back to B, and forever after.
    """
    kept = assignments.KeptTable()
    same(kept)
    replica = first_replica()
    Shard.objects.filter(replica=replica).update(gpu_indices=[6])  # B
    read = assignments.KeptTable._read

    def changed_meanwhile():
        Shard.objects.filter(replica=replica).update(gpu_indices=[7])  # C
        return read()

    monkeypatch.setattr(assignments.KeptTable, "_read", staticmethod(changed_meanwhile))
    same(kept)
    monkeypatch.setattr(assignments.KeptTable, "_read", staticmethod(read))
    Shard.objects.filter(replica=replica).update(gpu_indices=[6])  # B again
    table = same(kept)
    told = [s["gpus"] for shards in table.values() for s in shards if s["replica"] == replica.id]
    assert told and all(gpus == [6] for gpus in told), told


def test_an_unchanged_table_costs_two_queries_and_builds_nothing(placed):  # noqa: F811
    llama, _ = placed
    kept = assignments.KeptTable()
    kept.table()
    with CaptureQueriesContext(connection) as few:
        table = kept.table()
    for gpu in range(2, 8):
        place(llama, "hgx-000", [gpu])
    kept.table()
    with CaptureQueriesContext(connection) as more:
        assert kept.table() is kept.table()
    assert len(few) == 2 and len(more) == 4
    assert table is not kept.table()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rounds=st.lists(st.lists(st.sampled_from(sorted(CHANGES)), min_size=1, max_size=3), min_size=1, max_size=4))
def test_any_rounds_of_changes_give_the_table_read_afresh(placed, rounds):  # noqa: F811
    from django.db import transaction

    with transaction.atomic():
        kept = assignments.KeptTable()
        same(kept)
        for changes in rounds:
            for change in changes:
                if first_replica() is not None or change in ("adapter source", "back from stopping"):
                    try:
                        with transaction.atomic():
                            CHANGES[change]()
                    except Exception:  # noqa: BLE001 - a change the rows refuse (a rank taken twice) is no change
                        pass
            same(kept)
        transaction.set_rollback(True)
