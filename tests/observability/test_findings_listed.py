"""The fleet page's reading of the open findings is open_findings() without last_seen: the same order and values."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from core.models import Finding, Severity
from observability.findings import open_findings, open_findings_listed

pytestmark = pytest.mark.django_db


def findings(n: int, at: datetime, prefix: str = "node") -> None:
    """Both severities, shared and distinct first_seen to the microsecond, resolved ones among them."""
    for i in range(n):
        first = at - timedelta(microseconds=(i % 3) * 999_999 + (i % 2))
        Finding.objects.create(
            kind=("node_silent", "imex_down")[i % 2],
            subject=f"{prefix}-{i:03d}",
            message=f"message {i} <&>",
            severity=(Severity.CRITICAL, Severity.WARNING)[i % 3 == 0],
            first_seen=first,
            last_seen=at,
            resolved_at=at if i % 5 == 4 else None,
        )


def test_the_listed_findings_are_the_open_findings_without_last_seen():
    findings(24, timezone.now())
    Finding.objects.create(
        kind="x", subject="old", message="m", first_seen=datetime(1999, 12, 31, 23, 59, 59, 1, tzinfo=UTC)
    )
    want = [{k: v for k, v in f.items() if k != "last_seen"} for f in open_findings()]
    got = open_findings_listed()
    assert got == want and len(got) == 24 - 4 + 1
    assert [f["first_seen"].utcoffset() for f in got] == [timedelta(0)] * len(got)
    assert got[0]["severity"] == "critical" and got[-1]["severity"] == "warning"


def queries(n: int) -> int:
    with CaptureQueriesContext(connection) as seen:
        assert len(open_findings_listed()) == n
    return len(seen)


def test_the_listed_findings_take_one_query_however_many():
    findings(5, timezone.now())
    few = queries(4)  # of 5, one resolved
    findings(50, timezone.now() - timedelta(hours=1), prefix="more")
    assert queries(4 + 40) == few == 1
