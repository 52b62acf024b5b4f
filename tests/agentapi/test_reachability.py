"""Silence, in two stages, and a whole domain going dark recorded as one event."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from core.models import TaskRun
from inventory import reachability
from inventory.models import GPU, FleetEvent, Node, NVLinkDomain
from inventory.tasks import REACHABILITY, check_reachability
from inventory.writes.heartbeats import desk

pytestmark = pytest.mark.django_db

T0 = timezone.now()
# These racks are the whole fleet, which going silent together is a partition (tested in
# tests/placement/test_node_loss.py); here the domain's own patience is tested, so partitions are off.
ALONE = reachability.LossRules(share=1.0)


def ingest_heartbeat(node: Node, beat: dict, at) -> bool:
    """A heartbeat queued at the desk and flushed at once; True when the node came back."""
    node.credential_digest = node.credential_digest or f"digest-{node.pk}"
    Node.objects.filter(pk=node.pk).update(credential_digest=node.credential_digest)
    desk.remember(node)
    ref = desk.nodes[node.credential_digest]
    desk.accept(ref, beat, at)
    return any(pk == node.pk for pk, _ in desk.flush().came_back)


def seconds(s: float):
    return T0 + timedelta(seconds=s)


def rack(trays: int = 3, name: str = "rack") -> NVLinkDomain:
    domain = NVLinkDomain.objects.create(cluster_uuid=f"{name}-uuid", clique_id=1)
    for t in range(trays):
        node = Node.objects.create(name=f"{name}-tray-{t:02d}", last_seen=T0)
        for i in range(4):
            GPU.objects.create(
                node=node, index=i, uuid=f"{name}-{t}-{i}", name="GB200", gpu_class="gb200-185g", domain=domain
            )
    return domain


def test_a_silent_node_is_unreachable_after_the_grace_then_lost():
    Node.objects.create(name="lonely", last_seen=T0)
    assert not reachability.sweep(seconds(10), grace_s=20).changed
    result = reachability.sweep(seconds(25), grace_s=20, lost_after_s=60)
    assert result.unreachable == ["lonely"] and not result.lost
    assert not Node.objects.get().reachable
    assert reachability.sweep(seconds(70), grace_s=20, lost_after_s=60).lost == []
    assert reachability.sweep(seconds(90), grace_s=20, lost_after_s=60).lost == ["lonely"]
    assert Node.objects.get().lost
    assert FleetEvent.objects.filter(kind=FleetEvent.Kind.NODE_LOST, subject="lonely").count() == 1


def test_a_heartbeat_brings_a_node_back():
    node = Node.objects.create(name="blip", last_seen=T0)
    reachability.sweep(seconds(25), grace_s=20)
    node.refresh_from_db()
    assert ingest_heartbeat(node, {}, seconds(26)) is True
    node.refresh_from_db()
    assert node.reachable and not node.lost and node.unreachable_since is None


def test_a_dark_domain_is_one_event_and_gets_a_longer_grace():
    domain = rack(trays=3)
    result = reachability.sweep(seconds(25), grace_s=20, lost_after_s=60, domain_lost_after_s=300, rules=ALONE)
    assert len(result.unreachable) == 3
    events = FleetEvent.objects.filter(kind=FleetEvent.Kind.DOMAIN_DARK)
    assert events.count() == 1 and events.get().domain == domain
    # A minute later, a lone node would be lost; the rack's trays are not.
    assert (
        reachability.sweep(seconds(120), grace_s=20, lost_after_s=60, domain_lost_after_s=300, rules=ALONE).lost == []
    )
    assert not Node.objects.filter(lost=True).exists()
    # The rack comes back: the event closes and nothing was ever lost.
    for node in Node.objects.all():
        ingest_heartbeat(node, {}, seconds(121))
    result = reachability.sweep(seconds(122), grace_s=20)
    assert result.domains_back == [str(domain.pk)]
    assert events.get().ended_at is not None


def test_a_dark_domain_that_stays_dark_is_lost_in_the_end():
    rack(trays=2)
    reachability.sweep(seconds(25), grace_s=20, lost_after_s=60, domain_lost_after_s=300, rules=ALONE)
    assert (
        len(reachability.sweep(seconds(330), grace_s=20, lost_after_s=60, domain_lost_after_s=300, rules=ALONE).lost)
        == 2
    )


def test_one_tray_of_a_rack_going_silent_is_not_a_dark_domain():
    rack(trays=3)
    Node.objects.exclude(name="rack-tray-00").update(last_seen=seconds(20))
    result = reachability.sweep(seconds(25), grace_s=20, lost_after_s=60)
    assert result.unreachable == ["rack-tray-00"]
    assert not FleetEvent.objects.filter(kind=FleetEvent.Kind.DOMAIN_DARK).exists()
    Node.objects.exclude(name="rack-tray-00").update(last_seen=seconds(85))
    assert reachability.sweep(seconds(90), grace_s=20, lost_after_s=60).lost == ["rack-tray-00"]


def watched_for(how_long: timedelta) -> None:
    """The sweeps have run unbroken for ``how_long``, the last of them 5 s ago."""
    now = timezone.now()
    TaskRun.objects.update_or_create(
        name=REACHABILITY,
        defaults={"last_pass": now - timedelta(seconds=5), "unbroken_since": now - how_long},
    )


def test_the_task_runs_under_its_lock():
    Node.objects.create(name="old", last_seen=T0 - timedelta(hours=1))
    watched_for(timedelta(hours=1))
    assert check_reachability() == {"unreachable": 1, "lost": 0}


@pytest.mark.parametrize("blind_for", [None, 21.0, 3600.0], ids=["never-ran", "a-failover", "an-hour"])
def test_a_sweep_that_was_blind_judges_no_silence_until_it_has_watched_for_a_grace(monkeypatch, blind_for):
    """The database fails over for longer than the grace: no sweep runs, no beat is written, and the
    serve processes hold the beats they took. The first sweep after must not call those nodes silent
    a second before their beats land; a node that stays silent is judged one grace later."""
    now = timezone.now()
    if blind_for is not None:
        TaskRun.objects.create(
            name=REACHABILITY,
            last_pass=now - timedelta(seconds=blind_for),
            unbroken_since=now - timedelta(hours=2),
        )
    Node.objects.create(name="held", last_seen=now - timedelta(seconds=40))
    Node.objects.create(name="dead", last_seen=now - timedelta(seconds=40))
    gone = Node.objects.create(name="gone", last_seen=now - timedelta(hours=1), reachable=False)
    Node.objects.filter(pk=gone.pk).update(unreachable_since=now - timedelta(hours=1))
    clock = [now]
    monkeypatch.setattr(timezone, "now", lambda: clock[0])

    answer = check_reachability()
    assert answer["unreachable"] == answer["lost"] == 0
    assert answer["judging_from"] == (now + timedelta(seconds=reachability.GRACE_S)).isoformat()
    assert set(Node.objects.filter(reachable=True).values_list("name", flat=True)) == {"held", "dead"}
    assert not Node.objects.get(name="gone").lost, "nor is a node long unreachable lost across the blindness"

    # The held beat lands; 5 s later the sweep still waits; once it has watched for a grace it judges.
    Node.objects.filter(name="held").update(last_seen=now - timedelta(seconds=1))
    clock[0] = now + timedelta(seconds=5)
    assert "judging_from" in check_reachability()
    Node.objects.filter(name="held").update(last_seen=clock[0])
    for s in (10, 15, 20):
        clock[0] = now + timedelta(seconds=s)
        Node.objects.filter(name="held").update(last_seen=clock[0])
        answer = check_reachability()
    assert answer == {"unreachable": 1, "lost": 1}
    assert not Node.objects.get(name="dead").reachable and Node.objects.get(name="held").reachable
    assert Node.objects.get(name="gone").lost


def test_a_grace_shorter_than_the_sweeps_period_still_lets_the_sweep_judge(monkeypatch):
    """LLMGW_NODE_GRACE_S=4 with a sweep every 5 s: each ordinary pass comes more than a grace after the last,
    and must not count as a break (or no node would ever be marked); a break of three periods still does."""
    monkeypatch.setenv("LLMGW_NODE_GRACE_S", "4")
    now = timezone.now()
    clock = [now]
    monkeypatch.setattr(timezone, "now", lambda: clock[0])
    Node.objects.create(name="quiet", last_seen=now - timedelta(seconds=60))
    assert "judging_from" in check_reachability(every_s=5.0), "a first start waits one grace"
    clock[0] = now + timedelta(seconds=5)
    assert check_reachability(every_s=5.0) == {"unreachable": 1, "lost": 0}
    Node.objects.create(name="later", last_seen=now)
    clock[0] = now + timedelta(seconds=20)
    assert "judging_from" in check_reachability(every_s=5.0), "15 s without a pass is a break"
    clock[0] = now + timedelta(seconds=25)
    assert check_reachability(every_s=5.0)["unreachable"] == 1


def test_the_beat_hands_the_sweep_its_period():
    from llmgw.celery import beat_schedule

    entry = beat_schedule({"LLMGW_EVERY_REACHABILITY": "2"})["reachability"]
    assert entry["kwargs"] == {"every_s": 2.0} and entry["schedule"] == 2.0
