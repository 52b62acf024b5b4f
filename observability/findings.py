"""The open findings of the doctor sweeps, as plain data for the summary API, the fleet page and ``ctl status``."""

from __future__ import annotations

from django.db.models import Case, IntegerField, Value, When

from core.models import Finding, Severity


def open_findings() -> list[dict]:
    """Every open finding, critical first, then the oldest first.

    Each is ``{"kind", "subject", "message", "severity", "first_seen",
    "last_seen"}``; the times are aware datetimes (a serializer or a template
    formats them). ``severity`` is "critical" or "warning". An empty list
    means the last sweep found nothing wrong — or that no sweep has run yet:
    TaskRun "observability.tasks.doctor_sweep" tells which.
    """
    order = Case(When(severity=Severity.CRITICAL, then=Value(0)), default=Value(1), output_field=IntegerField())
    rows = Finding.objects.open().annotate(rank=order).order_by("rank", "first_seen", "kind", "subject")
    return list(rows.values("kind", "subject", "message", "severity", "first_seen", "last_seen"))
