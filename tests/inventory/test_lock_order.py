"""The writers that update many nodes at once take their row locks in one order, so they never deadlock.

At 10,000 nodes the heartbeat flusher (one transaction, one UPDATE per node,
in the order the beats arrived) and the reachability sweep (one UPDATE naming
every silent node) met on ``inventory_node`` with each holding rows the other
wanted, and PostgreSQL aborted one of them: a second of heartbeats, or a
sweep's state changes, gone. The test makes the meeting certain: a third
connection holds the row in the middle, both writers lock up to it from
their own side and wait, and then it lets go.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.db import OperationalError, connection, transaction
from django.utils import timezone

from inventory import reachability
from inventory.models import Node
from inventory.writes.heartbeats import HeartbeatDesk

pytestmark = pytest.mark.django_db(transaction=True)

NODES = 200


def _waiting_on_locks() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        return cursor.fetchone()[0]


def _in_thread(work, errors: list, done: list) -> threading.Thread:
    def run() -> None:
        try:
            done.append(work())
        except Exception as exc:  # noqa: BLE001 - what the test reports: a deadlock, or anything else
            errors.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_the_flusher_and_the_sweep_meet_on_many_nodes_and_both_finish():
    silent_since = timezone.now() - timedelta(minutes=10)
    Node.objects.bulk_create(
        [
            Node(name=f"n-{i:04d}", last_seen=silent_since, credential_digest=f"d-{i}", reachable=True)
            for i in range(NODES)
        ]
    )
    nodes = list(Node.objects.order_by("pk"))
    middle = nodes[NODES // 2].pk
    desk = HeartbeatDesk()
    beat_at = timezone.now()
    for node in reversed(nodes):  # beats arrive in the other order from the sweep's
        desk.remember(node)
        desk.accept(desk.nodes[node.credential_digest], {"load": {"cpu_percent": 1.0}}, beat_at)

    holding, release = threading.Event(), threading.Event()

    def hold_the_middle() -> None:
        with transaction.atomic():
            list(Node.objects.select_for_update().filter(pk=middle))
            holding.set()
            release.wait(30)

    errors: list = []
    done: list = []
    holder = _in_thread(hold_the_middle, errors, done)
    assert holding.wait(10)
    writers = [
        _in_thread(desk.flush, errors, done),
        _in_thread(lambda: reachability.sweep(timezone.now(), grace_s=20.0), errors, done),
    ]
    deadline = time.monotonic() + 20
    while _waiting_on_locks() < 2 and time.monotonic() < deadline and not errors:
        time.sleep(0.02)
    release.set()
    for thread in [holder, *writers]:
        thread.join(60)
    assert errors == [], f"a writer failed: {errors!r}"
    # Whichever went first, the beats are written and every node is reachable: the sweep saw them fresh,
    # or the flush came after it and brought them back.
    assert Node.objects.filter(last_seen=beat_at, reachable=True, lost=False).count() == NODES


def test_a_node_that_beat_while_the_sweep_decided_is_not_marked_lost(monkeypatch):
    """The sweep reads the long-silent again under the lock: a beat written meanwhile keeps the node."""
    long_ago = timezone.now() - timedelta(hours=1)
    node = Node.objects.create(
        name="n-back", last_seen=long_ago, credential_digest="d-back", reachable=False, unreachable_since=long_ago
    )
    desk = HeartbeatDesk()
    desk.remember(node)
    desk.accept(desk.nodes["d-back"], {}, timezone.now())
    real = reachability._domains_of

    def beat_lands_meanwhile(node_ids):
        desk.flush()  # the node's beat is written after the sweep's first look and before its update
        return real(node_ids)

    monkeypatch.setattr(reachability, "_domains_of", beat_lands_meanwhile)
    result = reachability.sweep(timezone.now(), grace_s=20.0, lost_after_s=60.0)
    node.refresh_from_db()
    assert (node.reachable, node.lost, result.lost) == (True, False, [])


def test_a_flush_the_database_refused_goes_back_in_the_queue(monkeypatch):
    """A batch the database could not take (it went away, or deadlocked twice) is flushed with the next one,
    under anything newer from the same node; one that failed for another reason is dropped, not retried for
    ever ahead of every later beat."""
    node = Node.objects.create(name="n-q", last_seen=timezone.now() - timedelta(minutes=5), credential_digest="d-q")
    desk = HeartbeatDesk()
    desk.remember(node)
    first = timezone.now()
    desk.accept(desk.nodes["d-q"], {"load": {"cpu_percent": 5.0}, "shards": []}, first)

    def refused(pending):
        raise OperationalError("the database went away")

    monkeypatch.setattr(desk, "_write", refused)
    with pytest.raises(OperationalError):
        desk.flush()
    monkeypatch.undo()
    later = first + timedelta(seconds=1)
    desk.accept(desk.nodes["d-q"], {"load": {"cpu_percent": 7.0}}, later)
    assert desk.flush().written == 1
    node.refresh_from_db()
    assert (node.last_seen, node.load, node.shard_status) == (later, {"cpu_percent": 7.0}, [])


def test_a_flush_that_failed_for_another_reason_is_dropped(monkeypatch):
    node = Node.objects.create(name="n-x", last_seen=timezone.now() - timedelta(minutes=5), credential_digest="d-x")
    desk = HeartbeatDesk()
    desk.remember(node)
    desk.accept(desk.nodes["d-x"], {"load": {"cpu_percent": 5.0}, "shards": []}, timezone.now())

    def broken(pending):
        raise ValueError("a value the column cannot hold")

    monkeypatch.setattr(desk, "_write", broken)
    with pytest.raises(ValueError):
        desk.flush()
    monkeypatch.undo()
    assert desk.flush().written == 0, "not queued again"
