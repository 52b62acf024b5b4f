"""A partition in the summary, and an operator resuming moves: POST /api/v1/moves/resume, audited."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from core.models import AuditEntry, Finding
from inventory import reachability
from inventory.models import FleetEvent, Node
from tests.api.fleet import ingest_fleet

pytestmark = pytest.mark.django_db


@pytest.fixture
def partitioned(db):
    """Three nodes that went silent together a minute ago: the whole fleet, so a partition."""
    ingest_fleet("h100-hgx:3")
    now = timezone.now()
    Node.objects.update(last_seen=now - timedelta(seconds=60))
    result = reachability.sweep(now)
    assert result.partitions == ["the fleet"] and not result.lost
    return now


def test_the_summary_shows_an_open_partition(operator, partitioned):
    (p,) = operator.get("/api/v1/summary").json()["partitions"]
    assert p["group"] == "the fleet" and p["nodes"] == ["hgx-000", "hgx-001", "hgx-002"] and p["members"] == 3
    assert p["since"]


def test_resuming_ends_the_partition_resolves_its_finding_and_the_nodes_are_lost_at_the_next_sweep(
    operator, partitioned
):
    assert Finding.objects.open().filter(kind="partition").count() == 1
    # Two minutes on, still silent: held, not lost.
    assert reachability.sweep(partitioned + timedelta(seconds=120)).lost == []

    answer = operator.post("/api/v1/moves/resume", {}, format="json", HTTP_X_LLMGW_ACTOR="ana")
    assert answer.status_code == 200, answer.content
    (ended,) = answer.json()["resumed"]
    assert ended["group"] == "the fleet" and len(ended["nodes"]) == 3
    assert not Finding.objects.open().filter(kind="partition").exists()
    event = FleetEvent.objects.get(kind=FleetEvent.Kind.PARTITION)
    assert event.detail["ended"] == "resumed" and event.detail["resumed_by"] == "ana"
    entry = AuditEntry.objects.get(action="resume-moves")
    assert entry.actor == "ana" and entry.detail["partitions"] == ["the fleet"]
    assert entry.detail["user"] == "olivia" and entry.detail["token"]
    assert operator.get("/api/v1/summary").json()["partitions"] == []

    # The same silence is not a partition again: the nodes are lost now, and moved at the normal rate.
    result = reachability.sweep(timezone.now() + timedelta(seconds=130))
    assert not result.partitions and sorted(result.lost) == ["hgx-000", "hgx-001", "hgx-002"]


def test_resuming_with_nothing_open_says_so_and_is_still_audited(operator, db):
    answer = operator.post("/api/v1/moves/resume", {}, format="json")
    assert answer.status_code == 200 and answer.json() == {"resumed": []}
    assert AuditEntry.objects.filter(action="resume-moves").count() == 1


def test_a_read_only_token_cannot_resume(reader, partitioned):
    answer = reader.post("/api/v1/moves/resume", {}, format="json")
    assert answer.status_code == 403 and "read-only" in answer.json()["error"]
    assert FleetEvent.objects.filter(kind=FleetEvent.Kind.PARTITION, ended_at__isnull=True).count() == 1
