"""A reconcile that changed something tells the apps above, once it is committed (the console: tests/dashboard)."""

from __future__ import annotations

import pytest
from django.db import transaction

from placement import outgoing
from placement.writes.reconciler import reconcile
from tests.livespy import heard
from tests.placement.dbfleet import gpu_profile, model

pytestmark = pytest.mark.django_db


def test_a_reconcile_that_explained_a_model_tells_of_it_after_commit(django_capture_on_commit_callbacks):
    model("lonely", gpu_profile("h100-80g"))  # no fleet: unplaceable, so an explanation is written
    with heard(outgoing.placement_changed) as told, django_capture_on_commit_callbacks(execute=True):
        result = reconcile()
        assert told == [], "not before the reconcile's writes are committed"
    assert result.explained == ["lonely"]
    assert [call["result"] for call in told] == [result]


def test_a_reconcile_rolled_back_tells_nothing(django_capture_on_commit_callbacks):
    model("lonely", gpu_profile("h100-80g"))
    with (
        heard(outgoing.placement_changed) as told,
        django_capture_on_commit_callbacks(execute=True),
        pytest.raises(RuntimeError),
        transaction.atomic(),
    ):
        reconcile()
        raise RuntimeError("the caller's transaction fails after the reconcile")
    assert told == []


def test_a_reconcile_that_changed_nothing_tells_nothing(django_capture_on_commit_callbacks):
    with heard(outgoing.placement_changed) as told, django_capture_on_commit_callbacks(execute=True):
        assert not reconcile().changed
    assert told == []
