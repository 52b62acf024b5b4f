"""The gateway's records: the tenancy tree (organisation → team → key), prices,
budgets, usage and its hourly roll-up.

Money is kept in micros (millionths of the currency unit) as integers, so a
sum of a million requests is exact and never drifts the way floats would.
"""

from __future__ import annotations

import uuid

from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Q
from django.utils import timezone

from catalog.models import Adapter, CatalogModel


def _short_id() -> str:
    return uuid.uuid4().hex[:12]


class Organisation(models.Model):
    """The top of the tenancy tree; every team belongs to one."""

    name = models.CharField(max_length=100, unique=True)
    created_at = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Team(models.Model):
    """A group of keys inside an organisation.

    Team names are unique across organisations so that ``team=NAME`` in the
    API and in ``ctl`` always names one team. ``rpm``/``tpm`` NULL means the
    team has no rate limit of its own (its keys may still have one).
    """

    org = models.ForeignKey(Organisation, on_delete=models.PROTECT, related_name="teams")
    name = models.CharField(max_length=100, unique=True)
    rpm = models.PositiveIntegerField(
        "requests per minute", null=True, blank=True, help_text="Shared by every key of the team; empty: no limit."
    )
    tpm = models.PositiveIntegerField(
        "tokens per minute", null=True, blank=True, help_text="Prompt and completion tokens; empty: no limit."
    )
    created_at = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        ordering = ["org__name", "name"]

    def __str__(self) -> str:
        return self.name


class ApiKey(models.Model):
    """A client's key to the gateway.

    The secret is shown once, at creation, and stored only as ``digest``, its
    SHA-256, as every secret llmgw issues (core.credentials). ``prefix``
    is the start of the secret, enough for a person to tell keys apart in a
    list and too short to use. ``allowed_models`` NULL means every model in the
    catalog; a list limits the key to those names (aliases included).
    """

    id = models.CharField(primary_key=True, max_length=32, default=_short_id, editable=False)
    team = models.ForeignKey(Team, on_delete=models.PROTECT, related_name="keys")
    name = models.CharField(max_length=100, blank=True, help_text="What the key is for; optional.")
    prefix = models.CharField(max_length=24, editable=False)
    digest = models.CharField(max_length=64, unique=True, editable=False)
    allowed_models = models.JSONField(
        "models",
        null=True,
        blank=True,
        help_text='Model names this key may use, e.g. ["llama-3-8b"]; empty: every model.',
    )
    rpm = models.PositiveIntegerField("requests per minute", null=True, blank=True, help_text="Empty: no limit.")
    tpm = models.PositiveIntegerField("tokens per minute", null=True, blank=True, help_text="Empty: no limit.")
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = "API key"
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.team.name})" if self.team_id else self.prefix


class Price(models.Model):
    """What a model, or a LoRA adapter, costs per million prompt and per million completion tokens.

    A model with no price row costs nothing: its requests are recorded with
    cost 0 and no budget ever refuses them. An adapter is priced on its own
    row (``adapter``, ``model`` empty), never at its base model's price: it is
    a model of its own to the teams that pay for it.
    """

    model = models.OneToOneField(CatalogModel, null=True, blank=True, on_delete=models.CASCADE, related_name="price")
    adapter = models.OneToOneField(Adapter, null=True, blank=True, on_delete=models.CASCADE, related_name="price")
    prompt_micros_per_million = models.PositiveBigIntegerField(
        default=0, help_text="Micros (millionths of the currency) per million prompt tokens."
    )
    completion_micros_per_million = models.PositiveBigIntegerField(
        default=0, help_text="Micros per million completion tokens."
    )

    class Meta:
        ordering = ["model__name", "adapter__name"]
        constraints = [
            models.CheckConstraint(
                condition=Q(model__isnull=False, adapter__isnull=True) | Q(model__isnull=True, adapter__isnull=False),
                name="price_model_or_adapter",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.priced}: {self.prompt_micros_per_million}/{self.completion_micros_per_million}"

    @property
    def priced(self) -> str:
        """The name of what this price is for: the model's or the adapter's."""
        return self.model.name if self.model_id else self.adapter.name if self.adapter_id else ""

    def clean(self) -> None:
        if (self.model_id is None) == (self.adapter_id is None):
            raise ValidationError("a price is for one model or one adapter: choose exactly one")


class Scope(models.TextChoices):
    ORG = "org", "organisation"
    TEAM = "team", "team"
    KEY = "key", "key"


class Period(models.TextChoices):
    DAY = "day", "day"
    WEEK = "week", "week"
    MONTH = "month", "month"


class Budget(models.Model):
    """Money one scope may spend per period; at most one per organisation, team or key.

    ``spent_micros`` is what settled requests cost since ``period_start``; a
    row whose ``period_start`` is before the current period's start has spent
    nothing in this period (the next reservation rolls it over).
    ``reserved_micros`` is what requests in flight are estimated to cost: it
    is added before a request goes to an engine and taken back when it ends.
    """

    scope = models.CharField(max_length=8, choices=Scope.choices)
    org = models.OneToOneField(Organisation, null=True, blank=True, on_delete=models.CASCADE, related_name="budget")
    team = models.OneToOneField(Team, null=True, blank=True, on_delete=models.CASCADE, related_name="budget")
    key = models.OneToOneField(ApiKey, null=True, blank=True, on_delete=models.CASCADE, related_name="budget")
    amount_micros = models.PositiveBigIntegerField()
    period = models.CharField(max_length=8, choices=Period.choices, default=Period.MONTH)
    period_start = models.DateTimeField(default=timezone.now)
    spent_micros = models.BigIntegerField(default=0, editable=False)
    reserved_micros = models.BigIntegerField(default=0, editable=False)

    class Meta:
        ordering = ["scope", "id"]
        constraints = [
            models.CheckConstraint(
                condition=(
                    Q(scope="org", org__isnull=False, team__isnull=True, key__isnull=True)
                    | Q(scope="team", org__isnull=True, team__isnull=False, key__isnull=True)
                    | Q(scope="key", org__isnull=True, team__isnull=True, key__isnull=False)
                ),
                name="budget_one_scope",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.scope} {self.owner_name}: {self.amount_micros}/{self.period}"

    @property
    def owner_name(self) -> str:
        if self.scope == Scope.ORG:
            return self.org.name
        if self.scope == Scope.TEAM:
            return self.team.name
        return self.key.prefix


class TokensCountedBy(models.TextChoices):
    ENGINE = "engine", "the engine's own usage"
    LLMGW = "llmgw", "counted by llmgw (the engine sent none)"


class UsageRecord(models.Model):
    """One request that got past the key check: what it used and what it cost.

    ``replica_id`` is kept as text, not a foreign key: replicas come and go,
    the record of what they served must not. Empty means the request never
    reached a replica (refused, or no replica). ``model`` is the model that
    served it, which differs from ``requested`` after a fallback.
    ``ttfb_ms`` NULL means no byte came back from an engine.
    """

    at = models.DateTimeField(default=timezone.now, db_index=True)
    key = models.ForeignKey(ApiKey, on_delete=models.PROTECT, related_name="usage")
    team = models.ForeignKey(Team, on_delete=models.PROTECT, related_name="usage")
    org = models.ForeignKey(Organisation, on_delete=models.PROTECT, related_name="usage")
    requested = models.CharField(max_length=128)
    model = models.CharField(max_length=128, blank=True)
    replica_id = models.CharField(max_length=32, blank=True)
    endpoint = models.CharField(max_length=32)
    stream = models.BooleanField(default=False)
    prompt_tokens = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0)
    counted_by = models.CharField(max_length=8, choices=TokensCountedBy.choices, default=TokensCountedBy.ENGINE)
    cost_micros = models.BigIntegerField(default=0)
    status = models.PositiveSmallIntegerField()
    outcome = models.CharField(max_length=32, help_text="ok, or why not: the error code or client_disconnected.")
    latency_ms = models.FloatField()
    ttfb_ms = models.FloatField(null=True, blank=True)
    clamped = models.BooleanField(
        default=False,
        help_text="The engine reported more tokens than the request allowed (its prompt's bound, its length × its "
        "choices): the tokens here, and the cost, are those bounds.",
    )

    class Meta:
        ordering = ["-at"]
        indexes = [models.Index(fields=["key", "at"], name="usage_key_at")]

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.key_id} {self.model or self.requested} {self.status}"


class UsageHour(models.Model):
    """Usage summed per hour, key and served model: what ``/api/v1/usage`` reads.

    Written in the same transaction as the records it sums, so the two never
    disagree.
    """

    hour = models.DateTimeField()
    key = models.ForeignKey(ApiKey, on_delete=models.PROTECT, related_name="usage_hours")
    model = models.CharField(max_length=128)
    requests = models.PositiveBigIntegerField(default=0)
    errors = models.PositiveBigIntegerField(default=0)
    prompt_tokens = models.PositiveBigIntegerField(default=0)
    completion_tokens = models.PositiveBigIntegerField(default=0)
    cost_micros = models.BigIntegerField(default=0)
    clamped = models.PositiveBigIntegerField(default=0, help_text="Records whose engine-reported usage was clamped.")
    last_at = models.DateTimeField()

    class Meta:
        ordering = ["-hour"]
        constraints = [models.UniqueConstraint(fields=["hour", "key", "model"], name="usage_hour_unique")]

    def __str__(self) -> str:
        return f"{self.hour:%Y-%m-%d %H}h {self.key_id} {self.model}"


class RateWindow(models.Model):
    """Requests and tokens of one scope in one minute, for rate limits without Redis.

    ``scope`` is ``key:<id>`` or ``team:<id>``. Old windows are useless after
    two minutes and are deleted by the usage writer now and then.
    """

    scope = models.CharField(max_length=64)
    minute = models.BigIntegerField(help_text="Unix time // 60.")
    requests = models.PositiveIntegerField(default=0)
    tokens = models.PositiveBigIntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["scope", "minute"], name="rate_window_unique")]

    def __str__(self) -> str:
        return f"{self.scope}@{self.minute}"


class LeaseHolder(models.Model):
    """A gateway process that is alive, for as long as it keeps renewing this row (gateway.writes.leases).

    ``owner`` is the process's name on its leases (host, pid, a random part).
    Past ``expires_at`` the process is taken for dead and its leases are reaped.
    """

    owner = models.CharField(primary_key=True, max_length=64)
    expires_at = models.DateTimeField()

    def __str__(self) -> str:
        return self.owner


class Lease(models.Model):
    """What one gateway process holds reserved on one budget, for its requests in flight (gateway.writes.leases).

    A budget's ``reserved_micros`` is always the sum of its leases'
    ``micros``: both change in one transaction. ``expires_at`` is pushed
    forward by every reservation; the lease is reaped once it has passed and
    its ``owner`` has no live LeaseHolder row either. ``owner`` is not a
    foreign key: a reservation must not wait for the holder row to exist.
    """

    owner = models.CharField(max_length=64)
    budget = models.ForeignKey(Budget, on_delete=models.CASCADE, related_name="leases")
    micros = models.BigIntegerField(default=0)
    expires_at = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["owner", "budget"], name="lease_owner_budget_unique")]
        indexes = [models.Index(fields=["expires_at"], name="lease_expires_at")]

    def __str__(self) -> str:
        return f"{self.owner} holds {self.micros} on budget {self.budget_id}"


class SetAsideUsage(models.Model):
    """A usage record the database refused, kept for an operator instead of blocking every record behind it.

    ``record`` is the record as JSON text (text, not JSON, so that whatever
    it holds can be stored); ``reason`` is the database's refusal. Its
    reservation was given back when it was set aside. ``/metrics`` counts
    these rows (``llmgw_gateway_usage_records_set_aside_total``).
    """

    at = models.DateTimeField(default=timezone.now, db_index=True)
    reason = models.TextField()
    record = models.TextField()

    class Meta:
        ordering = ["-at"]
        verbose_name = "set-aside usage record"

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S}: {self.reason[:60]}"
