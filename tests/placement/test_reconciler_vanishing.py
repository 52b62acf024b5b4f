"""A reconciling pass whose rows vanish under it: the round still completes for everything else.

The pass reads the catalog and the fleet, plans, then writes. Anything it
read may be deleted by another transaction meanwhile: a model removed through
the API, a profile dropped by a redefinition, a node forgotten. Each test
deletes one such row from another connection, committed, between the pass's
snapshot and its writes (on PostgreSQL, whose foreign keys are checked at
commit: one replica pointing at a deleted row used to fail the whole pass with
an IntegrityError, and every other model's placement with it).
"""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection

from catalog import writes as service
from catalog.models import CatalogModel, DeclaredIn
from inventory.models import Node
from placement.models import Autoscale, PlacementExplanation, Replica, Shard
from placement.writes import autoscaling, reconciler
from tests.placement.dbfleet import fleet, gpu_profile, live, model

pytestmark = pytest.mark.django_db(transaction=True)

H100 = "h100-80g"


def _in_another_transaction(change) -> None:
    """Run ``change`` on a connection of its own and wait for its commit, as an operator's request would."""
    failed: list[BaseException] = []

    def run() -> None:
        try:
            change()
        except BaseException as exc:  # noqa: BLE001 — handed to the test, which fails on it
            failed.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(30)
    assert not thread.is_alive(), "the deletion waited on the pass"
    assert not failed, failed


def _remove_model(plan) -> None:
    service.remove_model("gone", actor="test")


def _drop_its_profile(plan) -> None:
    definition = service.model_definition(CatalogModel.objects.get(name="gone"))
    definition["profiles"] = [gpu_profile(H100, gpus=8, name="renamed")]
    service.upsert_model(definition, actor="test", declared_in=DeclaredIn.STORE)


def _forget_its_node(plan) -> None:
    (new,) = [n for n in plan.create if n.model == "gone"]
    Node.objects.filter(name__in=[s.node for s in new.shards]).delete()


@pytest.mark.parametrize("vanish", [_remove_model, _drop_its_profile, _forget_its_node])
def test_a_row_deleted_between_the_snapshot_and_the_writes_skips_what_points_at_it(monkeypatch, vanish):
    fleet("h100-hgx:2")
    # A whole node each, so that a node forgotten under one leaves the other's placement untouched.
    model("kept", gpu_profile(H100, gpus=8))
    model("gone", gpu_profile(H100, gpus=8))
    write = reconciler._apply

    def deleted_meanwhile(decided, loaded, now, result):
        assert {n.model for n in decided.create} == {"kept", "gone"}
        _in_another_transaction(lambda: vanish(decided))
        return write(decided, loaded, now, result)

    monkeypatch.setattr(reconciler, "_apply", deleted_meanwhile)

    result = reconciler.reconcile()

    (kept,) = live("kept")
    assert result.created == [kept.id]
    assert PlacementExplanation.objects.filter(model__name="kept").exists()
    assert not Replica.objects.filter(model__name="gone").exists()
    assert result.vanished, "what was skipped is said"
    if vanish is _remove_model:
        assert not CatalogModel.objects.filter(name="gone").exists()
    # The next pass plans from what is now there.
    monkeypatch.setattr(reconciler, "_apply", write)
    reconciler.reconcile()
    assert [r.id for r in live("kept")] == [kept.id]
    if vanish is _drop_its_profile:
        (again,) = live("gone")
        assert again.profile_name == "renamed" and again.profile is not None
    if vanish is _forget_its_node:
        assert Node.objects.count() == 1 and not Shard.objects.exclude(replica=kept).exists()


def test_a_model_deleted_while_autoscaling_reads_the_load_is_skipped(monkeypatch):
    fleet("h100-hgx:2")
    model("kept", gpu_profile(H100, gpus=8), max_replicas=2)
    model("gone", gpu_profile(H100, gpus=8), max_replicas=2)
    read_load = autoscaling.fleet

    def deleted_meanwhile(now, redis_url):
        load = read_load(now, redis_url)
        _in_another_transaction(lambda: service.remove_model("gone", actor="test"))
        return load

    monkeypatch.setattr(autoscaling, "fleet", deleted_meanwhile)

    result = reconciler.reconcile()

    assert result.vanished == ["autoscaling of gone"]
    assert [r.id for r in live("kept")] == result.created and Autoscale.objects.get().model.name == "kept"


def test_a_model_removed_while_the_pass_writes_waits_for_it_and_takes_what_it_placed(monkeypatch):
    fleet("h100-hgx:2")
    model("kept", gpu_profile(H100, gpus=8))
    model("gone", gpu_profile(H100, gpus=8))
    write = reconciler._apply
    removal: list[threading.Thread] = []
    failed: list[BaseException] = []

    def remove() -> None:
        try:
            service.remove_model("gone", actor="test")
        except BaseException as exc:  # noqa: BLE001 — handed to the test, which fails on it
            failed.append(exc)
        finally:
            connection.close()

    def removed_meanwhile(decided, loaded, now, result):
        write(decided, loaded, now, result)
        removal.append(threading.Thread(target=remove))
        removal[0].start()
        _until_a_lock_is_awaited()

    monkeypatch.setattr(reconciler, "_apply", removed_meanwhile)

    result = reconciler.reconcile()
    removal[0].join(30)

    assert not removal[0].is_alive() and not failed, failed
    assert len(result.created) == 2 and not result.vanished
    assert not CatalogModel.objects.filter(name="gone").exists()
    assert [r.id for r in live("kept")] == [r.id for r in Replica.objects.all()]


def _until_a_lock_is_awaited(timeout_s: float = 30) -> None:
    """Wait until another session of this database waits for a lock (the removal, for the pass's rows)."""
    deadline = time.monotonic() + timeout_s
    with connection.cursor() as cursor:
        while time.monotonic() < deadline:
            # Inside a transaction the activity view is read once and kept; this reads it anew.
            cursor.execute("SELECT pg_stat_clear_snapshot()")
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()"
            )
            if cursor.fetchone()[0]:
                return
            time.sleep(0.05)
    raise AssertionError("the removal never waited for the pass")
