"""Silence, in two stages, and a whole domain going dark recorded as one event."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from inventory import reachability
from inventory.models import GPU, FleetEvent, Node, NVLinkDomain
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


def test_the_task_runs_under_its_lock():
    from inventory.tasks import check_reachability

    Node.objects.create(name="old", last_seen=T0 - timedelta(hours=1))
    assert check_reachability() == {"unreachable": 1, "lost": 0}
