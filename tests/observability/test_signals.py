"""The doctor sweep tells the apps above when findings open or resolve (the console hears it: tests/dashboard)."""

from __future__ import annotations

import pytest

from observability import signals, sweeps
from observability.tasks import doctor_sweep
from tests.livespy import heard

pytestmark = pytest.mark.django_db


def test_a_sweep_that_opened_a_finding_tells_of_it(monkeypatch):
    found = sweeps.Recorded(opened=[("domain_partly_joined", "rack/1")])
    monkeypatch.setattr(sweeps, "sweep", lambda now: found)
    with heard(signals.findings_changed) as told:
        assert doctor_sweep()["opened"] == 1
    assert [call["result"] for call in told] == [found]


def test_a_sweep_that_changed_nothing_tells_nothing(monkeypatch):
    monkeypatch.setattr(sweeps, "sweep", lambda now: sweeps.Recorded(still_open=2))
    with heard(signals.findings_changed) as told:
        doctor_sweep()
    assert told == []
