"""The heartbeat desk tells the apps above inventory what it took, and hands out what they supply, through signals."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import DataError, OperationalError
from django.utils import timezone

from core.credentials import hash_token
from inventory.models import Node
from inventory.signals import HeartbeatTables, heartbeat_answers_wanted, heartbeats_flushed
from inventory.writes.heartbeats import HeartbeatDesk

pytestmark = pytest.mark.django_db


@pytest.fixture
def known():
    """A fresh desk (not the process's) that knows one registered node."""
    node = Node.objects.create(name="tray-01", last_seen=timezone.now(), credential_digest="digest-1")
    desk = HeartbeatDesk()
    desk.remember(node)
    return desk, desk.nodes["digest-1"], node


@pytest.fixture
def told():
    """Every ``heartbeats_flushed`` sent while the test runs, as the keyword arguments a receiver gets."""
    sent: list[dict] = []

    def receiver(sender, **kwargs):
        sent.append(kwargs)

    heartbeats_flushed.connect(receiver, dispatch_uid="test.told")
    yield sent
    heartbeats_flushed.disconnect(dispatch_uid="test.told")


def test_a_flush_tells_the_shards_the_nodes_back_and_the_collected_weights(known, told):
    desk, ref, node = known
    Node.objects.filter(pk=node.pk).update(reachable=False)
    at = timezone.now()
    shards = [{"id": "r-0", "replica": "r", "rank": 0, "state": "ready"}]
    desk.accept(ref, {"shards": shards, "collected": [{"path": "/models/old"}]}, at)
    assert told == [], "nothing is told before the flush"
    desk.flush()
    (said,) = told
    assert said["shard_reports"] == [(node.pk, "tray-01", shards)]
    assert said["came_back"] == [(node.pk, "tray-01")]
    assert said["collected"] == [("tray-01", {"path": "/models/old"})]
    assert said["at"] == at


def test_shards_said_again_unchanged_are_not_told_again_and_a_change_is(known, told):
    """The stored shards are read as text and decoded once per distinct text: equal shards still compare equal."""
    desk, ref, node = known
    shards = [{"id": "r-0", "replica": "r", "rank": 0, "state": "ready", "progress": 0.5, "note": "é\u2028"}]
    desk.accept(ref, {"shards": shards}, timezone.now())
    desk.flush()
    assert told[-1]["shard_reports"] == [(node.pk, "tray-01", shards)]
    told.clear()
    desk.accept(ref, {"shards": [dict(reversed(list(s.items()))) for s in shards]}, timezone.now())
    desk.flush()
    assert told == []
    changed = [{**shards[0], "state": "loading"}]
    desk.accept(ref, {"shards": changed}, timezone.now())
    desk.flush()
    assert told[-1]["shard_reports"] == [(node.pk, "tray-01", changed)]


def test_a_beat_that_says_nothing_new_tells_nobody(known, told):
    desk, ref, _ = known
    desk.accept(ref, {"load": {"cpu_percent": 3.0}}, timezone.now())
    assert desk.flush().written == 1
    assert told == []


def test_the_answers_hand_out_what_the_apps_above_supply(known):
    desk, ref, node = known

    def tables(sender, **kwargs):
        return HeartbeatTables(shards={node.pk: [{"id": "r-0"}]}, collect={"tray-01": ["/models/old"]})

    heartbeat_answers_wanted.connect(tables, dispatch_uid="test.tables")
    try:
        desk.refresh_shards()
    finally:
        heartbeat_answers_wanted.disconnect(dispatch_uid="test.tables")
    answer = desk.accept(ref, {}, timezone.now())
    assert answer == {"shards": [{"id": "r-0"}], "send_report": True, "collect": ["/models/old"]}


def test_beats_the_database_did_not_take_are_written_by_the_next_flush(known, monkeypatch):
    """A failover: the flush cannot reach the database; the beats wait, the newest of each node, merged."""
    desk, ref, node = known
    first, second = timezone.now(), timezone.now() + timedelta(seconds=2)
    desk.accept(ref, {"shards": [{"id": "r-0", "replica": "r", "rank": 0, "state": "ready"}]}, first)
    real = desk._write

    def away(pending):
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(desk, "_write", away)
    with pytest.raises(OperationalError):
        desk.flush()
    desk.accept(ref, {"load": {"cpu_percent": 3.0}}, second)
    assert len(desk.pending) == 1, "one entry per node, however long the database is away"
    monkeypatch.setattr(desk, "_write", real)
    assert desk.flush().written == 1
    node.refresh_from_db()
    assert node.last_seen == second and node.shard_status[0]["state"] == "ready"


def test_beats_the_database_refused_for_what_they_hold_are_not_kept(known, monkeypatch):
    desk, ref, _ = known
    desk.accept(ref, {}, timezone.now())

    def refused(pending):
        raise DataError("value out of range")

    monkeypatch.setattr(desk, "_write", refused)
    with pytest.raises(DataError):
        desk.flush()
    assert desk.pending == {}


class _NoScans(dict):
    """The desk's credential cache, refusing to be walked: what a registration does must not grow with the fleet."""

    def items(self):
        raise AssertionError("the desk walked every cached credential")

    __iter__ = values = keys = items


def test_a_registration_tells_the_desk_without_walking_every_node_it_knows():
    desk = HeartbeatDesk()
    desk.nodes = _NoScans()
    nodes = [Node.objects.create(name=f"n-{i}", credential_digest=f"d-{i}") for i in range(3)]
    for node in nodes:
        desk.remember(node)
    rotated = nodes[1]
    rotated.credential_digest = "d-1-rotated"
    desk.remember(rotated)  # a re-registration: a fresh credential for the same node
    assert "d-1" not in desk.nodes and desk.nodes["d-1-rotated"].pk == rotated.pk
    assert [desk.nodes[f"d-{i}"].pk for i in (0, 2)] == [nodes[0].pk, nodes[2].pk]
    assert desk.digests == {nodes[0].pk: {"d-0"}, rotated.pk: {"d-1-rotated"}, nodes[2].pk: {"d-2"}}


def test_every_credential_a_node_was_cached_under_stops_when_it_registers_again():
    # Two digests cached for one node: its credential was rotated by another process and
    # this one looked both up. The next registration here leaves only the one it made.
    node = Node.objects.create(name="twice", credential_digest=hash_token("s1"))
    desk = HeartbeatDesk()
    assert desk.lookup("s1").pk == node.pk
    Node.objects.filter(pk=node.pk).update(credential_digest=hash_token("s2"))
    assert desk.lookup("s2").pk == node.pk
    assert desk.digests == {node.pk: {hash_token("s1"), hash_token("s2")}}
    node.credential_digest = hash_token("s3")
    desk.remember(node)
    assert set(desk.nodes) == {hash_token("s3")} and desk.digests == {node.pk: {hash_token("s3")}}
    node.credential_digest = ""  # a node told without a credential is forgotten whole
    desk.remember(node)
    assert not desk.nodes and not desk.digests
    assert desk.lookup("s3") is None and not desk.digests  # unknown (not stored): nothing cached


def _counting_fleet_reads(monkeypatch) -> list[int]:
    """How many times the desk reads every node's credential, and how many rows each time."""
    from inventory.writes import heartbeats

    reads: list[int] = []
    real = heartbeats._FLEET_REFS.rows
    monkeypatch.setattr(
        heartbeats._FLEET_REFS, "rows", lambda *a, **k: reads.append(len(rows := real(*a, **k))) or rows
    )
    return reads


def test_a_credential_the_desk_does_not_know_makes_it_learn_the_fleet_in_one_read(monkeypatch):
    """One of several admin processes meets every node another registered: one query, not one per node."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    reads = _counting_fleet_reads(monkeypatch)
    for i in range(30):
        Node.objects.create(name=f"n-{i:02}", credential_digest=hash_token(f"s{i}"), report_digest=f"r{i}")
    Node.objects.create(name="never-registered")  # no credential: not learned
    desk = HeartbeatDesk()
    with CaptureQueriesContext(connection) as queries:
        # As the fast lane asks: the cache first, the database when it does not know.
        refs = [desk.cached(f"s{i}") or desk.lookup(f"s{i}") for i in range(30)]
    assert len(queries) == 1 and reads == [30], [q["sql"][:60] for q in queries]
    assert [(r.name, r.report_digest) for r in refs] == [(f"n-{i:02}", f"r{i}") for i in range(30)]
    assert all(desk.cached(f"s{i}") is not None for i in range(30))

    # Within LEARN_EVERY_S a credential still not known is looked up alone: registered since, or wrong.
    late = Node.objects.create(name="late", credential_digest=hash_token("late"))
    with CaptureQueriesContext(connection) as queries:
        assert desk.lookup("late").pk == late.pk
        assert desk.lookup("wrong") is None
    assert len(queries) == 2 and reads == [30]
    assert desk.cached("wrong") is None


def test_the_fleet_is_read_again_only_after_learn_every_s(monkeypatch):
    from inventory.writes import heartbeats

    reads = _counting_fleet_reads(monkeypatch)
    Node.objects.create(name="a", credential_digest=hash_token("a"))
    desk = HeartbeatDesk()
    assert desk.lookup("wrong") is None and desk.lookup("also-wrong") is None
    assert reads == [1], "a stream of unknown credentials reads the fleet once per LEARN_EVERY_S, not each time"
    now = heartbeats.time.monotonic()
    monkeypatch.setattr(heartbeats.time, "monotonic", lambda: now + heartbeats.LEARN_EVERY_S + 1)
    assert desk.lookup("wrong") is None and reads == [1, 1]


def test_what_the_desk_was_told_while_it_read_the_fleet_is_kept(monkeypatch):
    """A node re-registered (a new credential) while the fleet was read: the old credential is not learned back."""
    from inventory.writes import heartbeats

    node = Node.objects.create(name="rotating", credential_digest=hash_token("old"))
    desk = HeartbeatDesk()
    real = heartbeats._FLEET_REFS.rows

    def read_then_rotate(*a, **k):
        rows = real(*a, **k)  # still the old credential
        node.credential_digest = hash_token("new")
        Node.objects.filter(pk=node.pk).update(credential_digest=node.credential_digest)
        desk.remember(node)  # the registration view, on another thread, meanwhile
        return rows

    monkeypatch.setattr(heartbeats._FLEET_REFS, "rows", read_then_rotate)
    desk.learn_fleet()
    assert set(desk.nodes) == {hash_token("new")} and desk.digests == {node.pk: {hash_token("new")}}


def test_one_thread_reads_the_fleet_while_the_others_look_up_alone(monkeypatch):
    import threading

    from django.db import connections

    from inventory.writes import heartbeats

    Node.objects.create(name="a", credential_digest=hash_token("a"))
    desk = HeartbeatDesk()
    inside, release = threading.Event(), threading.Event()
    real = heartbeats._FLEET_REFS.rows
    reads = []

    def slow(*a, **k):
        reads.append(1)
        inside.set()
        release.wait(10)
        return real(*a, **k)

    monkeypatch.setattr(heartbeats._FLEET_REFS, "rows", slow)

    def learn() -> None:
        try:
            desk.learn_fleet()
        finally:
            connections.close_all()  # this thread's own connection

    learner = threading.Thread(target=learn)
    # learn_fleet runs outside lookup here: mark it as lookup would before starting it.
    assert desk._learning_due()
    learner.start()
    assert inside.wait(10)
    assert not desk._learning_due(), "a second reader while one reads"
    release.set()
    learner.join(10)
    assert reads == [1] and not desk.learning
