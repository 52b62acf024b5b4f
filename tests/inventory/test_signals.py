"""Inventory's periodic work tells the apps above through its signals (the console hears them: tests/dashboard)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from core.models import TaskRun
from inventory import signals
from inventory.models import Node
from inventory.tasks import REACHABILITY, check_reachability
from tests.livespy import heard

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def watching():
    """The sweeps have run unbroken for an hour: they judge silence (core.continuity)."""
    now = timezone.now()
    TaskRun.objects.create(
        name=REACHABILITY, last_pass=now - timedelta(seconds=5), unbroken_since=now - timedelta(hours=1)
    )


def test_the_reachability_sweep_tells_of_a_silent_node():
    Node.objects.create(name="quiet", last_seen=timezone.now() - timedelta(seconds=30))
    with heard(signals.reachability_changed) as told:
        check_reachability()
    assert [call["result"].unreachable for call in told] == [["quiet"]]
    assert told[0]["sender"] is Node


def test_a_sweep_that_changed_nothing_tells_nothing():
    Node.objects.create(name="chatty", last_seen=timezone.now())
    with heard(signals.reachability_changed) as told:
        check_reachability()
    assert told == []
