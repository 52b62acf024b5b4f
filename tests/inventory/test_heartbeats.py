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
