"""API tokens, the audit log, task runs, the doctor sweeps' findings, and histograms shared by every process."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

from core.credentials import hash_token, hint, new_token


class ApiTokenQuerySet(models.QuerySet):
    def active(self) -> ApiTokenQuerySet:
        return self.filter(revoked_at__isnull=True)


class ApiToken(models.Model):
    """A bearer token for the admin API, owned by an operator account.

    Only the hash is stored; ``hint`` lets a person recognise it in a list.
    A revoked token stays as a row so the audit log can still name it.
    """

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100, help_text="What this token is for, e.g. 'ctl on my laptop'.")
    digest = models.CharField(max_length=64, unique=True, editable=False)
    hint = models.CharField(max_length=20, editable=False)
    read_only = models.BooleanField(default=False, help_text="May read (metrics, listings) but change nothing.")
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)
    revoked_at = models.DateTimeField(null=True, blank=True)

    objects = ApiTokenQuerySet.as_manager()

    class Meta:
        verbose_name = "API token"
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({self.hint})"

    @classmethod
    def issue(cls, user, name: str, *, read_only: bool = False) -> tuple[ApiToken, str]:
        """Create a token and return it with its secret, which is never stored."""
        secret = new_token("llmgw_adm")
        token = cls.objects.create(
            user=user, name=name, digest=hash_token(secret), hint=hint(secret), read_only=read_only
        )
        return token, secret


class AuditEntry(models.Model):
    """One change made through the API, the admin or ctl: who, when, what."""

    at = models.DateTimeField(default=timezone.now, db_index=True)
    actor = models.CharField(max_length=200, help_text="X-Llmgw-Actor if sent, else the token's owner.")
    action = models.CharField(max_length=50, db_index=True)
    target = models.CharField(max_length=200, blank=True)
    detail = models.JSONField(default=dict, blank=True)

    class Meta:
        verbose_name = "audit entry"
        verbose_name_plural = "audit log"
        ordering = ["-at"]

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.actor} {self.action} {self.target}"

    def save(self, *args, **kwargs) -> None:
        """Fit the names to their columns and add the caller of the request being served, if any.

        Done here rather than by each writer (the catalog, node states, the
        API, the admin) so that none can forget it: a long name never fails
        the insert after the change it records was made, and every row
        written while an API request is served names its account and token.
        """
        self.actor = fit_audit_text(self.actor, ACTOR_MAX) or "unknown"
        self.action = fit_audit_text(self.action, ACTION_MAX)
        self.target = fit_audit_text(self.target, TARGET_MAX)
        if self._state.adding and (who := _caller.get()):
            self.detail = {**(self.detail or {}), **who}
        super().save(*args, **kwargs)

    @classmethod
    def record(cls, actor: str, action: str, target: str, detail: dict | None = None) -> AuditEntry:
        """Write one change to the log: the one way every app writes an audit row (names fitted by save())."""
        return cls.objects.create(actor=actor, action=action, target=target, detail=detail or {})


# The one audit rule for names: runs of whitespace (newlines included) become one space,
# NULs and lone surrogates are dropped (PostgreSQL text cannot hold them), and the rest is cut
# at the column.
ACTOR_MAX = AuditEntry._meta.get_field("actor").max_length
ACTION_MAX = AuditEntry._meta.get_field("action").max_length
TARGET_MAX = AuditEntry._meta.get_field("target").max_length

# Who is behind the request this thread is serving ({"via": "api", "user": …, "token": …}),
# set by the API's base for the length of one request; None outside one.
_caller: ContextVar[dict[str, str] | None] = ContextVar("llmgw_audit_caller", default=None)


@contextmanager
def audited_as(who: dict[str, str]) -> Iterator[dict[str, str]]:
    """Every audit row written inside this block also records ``who`` (filled in as it becomes known)."""
    reset = _caller.set(who)
    try:
        yield who
    finally:
        _caller.reset(reset)


def fit_audit_text(text: str, limit: int) -> str:
    """``text`` as the audit log keeps it: one line, no NUL, at most ``limit`` characters."""
    kept = "".join(c for c in str(text) if c != "\x00" and not "\ud800" <= c <= "\udfff")
    return " ".join(kept.split())[:limit]


class TaskRun(models.Model):
    """The last run of each task: begun (core.runs, as the task begins) and finished (observability.tasks).

    Lets an operator see that the reconciler and the sweeps are running, and
    when they last failed, without reading worker logs.
    """

    name = models.CharField(max_length=200, unique=True)
    last_started = models.DateTimeField(null=True, blank=True)
    last_finished = models.DateTimeField(null=True, blank=True)
    last_ok = models.BooleanField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    runs = models.PositiveBigIntegerField(default=0)
    # The id of the run that last began (core.runs): a second delivery of it is skipped, and the beat
    # asks it whether a run it sent has begun.
    last_run = models.CharField(max_length=255, blank=True, default="")
    # Written by the task itself, in its own transaction (core.continuity): when its work last
    # committed, and since when it has committed without a gap longer than it can be blind for.
    last_pass = models.DateTimeField(null=True, blank=True)
    unbroken_since = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Severity(models.TextChoices):
    WARNING = "warning", "warning"
    CRITICAL = "critical", "critical"


class FindingQuerySet(models.QuerySet):
    def open(self) -> FindingQuerySet:
        return self.filter(resolved_at__isnull=True)


class Finding(models.Model):
    """Something wrong across the fleet that a doctor sweep found, from when it was first seen until it cleared.

    One open row per (kind, subject). When the condition clears the row is
    resolved and kept, so the history shows how long it lasted; if it comes
    back it is a new row with a new ``first_seen``. ``resolved_at`` NULL means
    still open.
    """

    kind = models.CharField(max_length=50, db_index=True)
    subject = models.CharField(max_length=200, help_text="The node, domain, fabric, GPU or model it is about.")
    message = models.TextField(help_text="What is wrong and what to do, in a sentence or two.")
    severity = models.CharField(max_length=16, choices=Severity.choices, default=Severity.WARNING)
    first_seen = models.DateTimeField(default=timezone.now)
    last_seen = models.DateTimeField(default=timezone.now)
    resolved_at = models.DateTimeField(null=True, blank=True, db_index=True)

    objects = FindingQuerySet.as_manager()

    class Meta:
        ordering = ["-first_seen"]
        constraints = [
            models.UniqueConstraint(
                fields=["kind", "subject"], condition=Q(resolved_at__isnull=True), name="finding_one_open_per_subject"
            ),
            models.CheckConstraint(condition=Q(severity__in=Severity.values), name="finding_severity_valid"),
        ]

    def __str__(self) -> str:
        return f"{self.kind}: {self.subject}"

    @property
    def open(self) -> bool:
        return self.resolved_at is None


class SharedHistogram(models.Model):
    """A Prometheus histogram every process adds to: the reconciler's runs happen in any worker.

    ``bounds`` are the buckets' upper bounds (+Inf implied); ``counts`` holds
    one count per bucket, not cumulative, the last one for +Inf. Kept in the
    database because the figure is fleet-wide: a scrape of any process must
    see every worker's observations.
    """

    name = models.CharField(max_length=100, unique=True)
    bounds = models.JSONField(default=list)
    counts = models.JSONField(default=list)
    total = models.FloatField(default=0.0, help_text="The sum of every observation.")
    count = models.PositiveBigIntegerField(default=0)
    updated_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name
