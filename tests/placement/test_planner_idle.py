"""A process that has stopped planning lets go of its planner and snapshot reader, and plans as before if asked.

Each Celery pool process that runs a reconciling pass keeps what it planned
from (placement.writes.reconciler). When the passes go to another process,
the state of this one is only memory: after ``IDLE_S`` without a pass it is
let go, at the end of whatever task the process runs next.
"""

from __future__ import annotations

import time

import pytest
from celery.signals import task_postrun

from placement.models import Replica
from placement.writes import reconciler
from tests.placement.dbfleet import fleet, gpu_profile, model

pytestmark = pytest.mark.django_db


@pytest.fixture
def planned():
    fleet("h100-hgx:2")
    model("llama", gpu_profile("h100-80g", gpus=2), min_replicas=2)
    reconciler.let_go_if_idle(float("inf"))  # whatever an earlier test left
    first = reconciler.reconcile()
    assert len(first.created) == 2
    return first


def test_a_planner_used_within_the_window_is_kept(planned):
    planner, reader = reconciler._PLANNER, reconciler._READER
    assert not reconciler.let_go_if_idle(time.monotonic() + reconciler.IDLE_S - 1)
    assert reconciler._PLANNER is planner and reconciler._READER is reader


def test_an_idle_planner_is_let_go_and_the_next_pass_plans_in_full_to_the_same_end(planned):
    planner = reconciler._PLANNER
    reconciler.reconcile()  # after a pass that placed, a full one; then the planner follows
    reconciler.reconcile()
    assert reconciler._PLANNER.incremental
    assert reconciler.let_go_if_idle(time.monotonic() + reconciler.IDLE_S + 1)
    assert reconciler._PLANNER is not planner and reconciler._last_planned is None
    assert not reconciler.let_go_if_idle(float("inf")), "nothing is held: nothing to let go"
    replicas = set(Replica.objects.values_list("id", flat=True))
    again = reconciler.reconcile()
    assert not reconciler._PLANNER.incremental, "a first pass again"
    assert not again.changed and set(Replica.objects.values_list("id", flat=True)) == replicas


def test_a_task_ending_lets_go_of_an_idle_planner(planned, monkeypatch):
    planner = reconciler._PLANNER
    task_postrun.send(sender=None, task_id="t", task=None, args=(), kwargs={}, retval=None, state="SUCCESS")
    assert reconciler._PLANNER is planner, "it planned a moment ago"
    monkeypatch.setattr(reconciler, "_last_planned", time.monotonic() - reconciler.IDLE_S - 1)
    task_postrun.send(sender=None, task_id="t", task=None, args=(), kwargs={}, retval=None, state="SUCCESS")
    assert reconciler._PLANNER is not planner
