"""The open findings of the doctor sweeps, as plain data for the summary API, the fleet page and ``ctl status``."""

from __future__ import annotations

from datetime import datetime

from django.db.models import Case, IntegerField, QuerySet, Value, When

from core import dbtimes
from core.models import Finding, Severity


def open_findings() -> list[dict]:
    """Every open finding, critical first, then the oldest first.

    Each is ``{"kind", "subject", "message", "severity", "first_seen",
    "last_seen"}``; the times are aware datetimes (a serializer or a template
    formats them). ``severity`` is "critical" or "warning". An empty list
    means the last sweep found nothing wrong — or that no sweep has run yet:
    TaskRun "observability.tasks.doctor_sweep" tells which.
    """
    return list(_in_order().values("kind", "subject", "message", "severity", "first_seen", "last_seen"))


def open_findings_listed() -> list[dict]:
    """:func:`open_findings` as the fleet page lists them: without ``last_seen``, the same order and values.

    A large fleet's silent nodes are thousands of findings, and parsing their
    two times was most of reading them: ``first_seen`` is read as microseconds
    (core.dbtimes) and made an aware datetime (UTC) once per distinct value,
    which the findings of one sweep share.
    """
    rows = dbtimes.with_microseconds(_in_order(), first_seen_us="first_seen")
    made: dict[int, datetime] = {}
    out = []
    for kind, subject, message, severity, us in rows.values_list(
        "kind", "subject", "message", "severity", "first_seen_us"
    ):
        if (at := made.get(us)) is None:
            at = made[us] = dbtimes.datetime_of(us)
        out.append({"kind": kind, "subject": subject, "message": message, "severity": severity, "first_seen": at})
    return out


def _in_order() -> QuerySet:
    """The open findings, critical first, then the oldest first."""
    order = Case(When(severity=Severity.CRITICAL, then=Value(0)), default=Value(1), output_field=IntegerField())
    return Finding.objects.open().annotate(rank=order).order_by("rank", "first_seen", "kind", "subject")
