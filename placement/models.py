"""Replicas of models and the shards they run as, one shard per node."""

from __future__ import annotations

import secrets
import uuid

from django.db import models
from django.db.models import Q
from django.utils import timezone

from catalog.models import CatalogModel, Profile
from inventory.models import Node, NVLinkDomain


class ReplicaState(models.TextChoices):
    PENDING = "pending", "pending"
    STARTING = "starting", "starting"
    READY = "ready", "ready"
    FAILED = "failed", "failed"
    STOPPING = "stopping", "stopping"


class ShardState(models.TextChoices):
    PENDING = "pending", "pending"
    FETCHING = "fetching", "fetching weights"
    STARTING = "starting", "starting"
    READY = "ready", "ready"
    FAILED = "failed", "failed"
    STOPPING = "stopping", "stopping"


def _short_id() -> str:
    return uuid.uuid4().hex[:12]


def new_engine_key() -> str:
    """A replica's engine key: 256 random bits, URL-safe, one header word."""
    return secrets.token_urlsafe(32)


class Replica(models.Model):
    """One running copy of a model, on one or more nodes.

    ``profile_fingerprint`` is the profile's fingerprint when it was placed;
    when the catalog's differs, the replica is stale (reported, not restarted).
    ``last_used_at`` NULL means no request has been routed to it yet: the API
    shows ``idle_seconds`` -1 for it, while idle scale-down counts its idleness
    from its creation.

    ``engine_key`` is the secret the replica's engine requires on every
    request: the gateway sends it, and the nodes that run the replica get it
    in their shard assignments and nowhere else. No listing, page or log
    shows it.

    """

    id = models.CharField(primary_key=True, max_length=32, default=_short_id, editable=False)
    model = models.ForeignKey(CatalogModel, on_delete=models.CASCADE, related_name="replicas")
    profile = models.ForeignKey(Profile, null=True, blank=True, on_delete=models.SET_NULL, related_name="replicas")
    profile_name = models.CharField(max_length=64)
    profile_fingerprint = models.CharField(max_length=16, blank=True)
    state = models.CharField(max_length=16, choices=ReplicaState.choices, default=ReplicaState.PENDING, db_index=True)
    pool = models.CharField(max_length=100, blank=True)
    fabric = models.CharField(max_length=100, blank=True, help_text="The InfiniBand fabric a multi-node replica uses.")
    nvlink_domain = models.ForeignKey(
        NVLinkDomain, null=True, blank=True, on_delete=models.SET_NULL, related_name="replicas"
    )
    endpoint = models.CharField(max_length=300, blank=True)
    adapters = models.JSONField(
        default=list,
        blank=True,
        help_text="The LoRA adapters its engine has loaded, as rank 0's agent last said; the gateway prefers these.",
    )
    engine_key = models.CharField(max_length=64, default=new_engine_key, editable=False)
    replaces = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="replaced_by",
        help_text="The replica this one is taking over from (a drain): that one stops once this is ready.",
    )
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    last_used_at = models.DateTimeField(null=True, blank=True)
    ready_at = models.DateTimeField(null=True, blank=True, help_text="When it first became ready.")
    stopping_since = models.DateTimeField(
        null=True, blank=True, help_text="When the reconciler told its nodes to stop it; NULL while it is wanted."
    )
    error = models.TextField(blank=True)

    class Meta:
        ordering = ["model__name", "created_at"]
        constraints = [
            models.CheckConstraint(condition=Q(state__in=ReplicaState.values), name="replica_state_valid"),
        ]

    def __str__(self) -> str:
        return f"{self.model.name}#{self.id}"

    @property
    def stale(self) -> bool:
        """Placed under a profile definition the catalog no longer holds.

        A replica with no recorded fingerprint, or whose profile is gone, is
        not called stale: those are different facts with their own states.
        """
        if not self.profile_fingerprint or self.profile is None:
            return False
        return self.profile.fingerprint != self.profile_fingerprint


class Shard(models.Model):
    """The part of a replica that runs on one node.

    ``fetch_total`` NULL with ``fetch_done`` set means the source did not say
    how large the weights are: progress is shown in bytes only.
    """

    replica = models.ForeignKey(Replica, on_delete=models.CASCADE, related_name="shards")
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="shards")
    rank = models.PositiveSmallIntegerField(default=0)
    gpu_indices = models.JSONField(default=list, blank=True)
    env = models.JSONField(default=dict, blank=True)
    state = models.CharField(max_length=16, choices=ShardState.choices, default=ShardState.PENDING, db_index=True)
    error = models.TextField(blank=True)
    fetch_source = models.CharField(max_length=500, blank=True)
    fetch_done = models.BigIntegerField(null=True, blank=True)
    fetch_total = models.BigIntegerField(null=True, blank=True)
    phases = models.JSONField(
        default=dict, blank=True, help_text="The start's phases as the agent last reported them (fetch_s, load_s, …)."
    )

    class Meta:
        ordering = ["replica", "rank"]
        constraints = [
            models.UniqueConstraint(fields=["replica", "rank"], name="shard_unique_rank"),
            models.CheckConstraint(
                condition=Q(fetch_done__isnull=True) | Q(fetch_done__gte=0), name="shard_fetch_done_nonneg"
            ),
            models.CheckConstraint(
                condition=Q(fetch_total__isnull=True) | Q(fetch_total__gte=0), name="shard_fetch_total_nonneg"
            ),
            models.CheckConstraint(condition=Q(state__in=ShardState.values), name="shard_state_valid"),
        ]

    def __str__(self) -> str:
        return f"{self.replica_id}/{self.rank}@{self.node.name}"

    @property
    def fetch_percent(self) -> int | None:
        """None when the total is unknown: an invented percentage that stops moving misleads."""
        if self.fetch_done is None or not self.fetch_total:
            return None
        return min(100, int(self.fetch_done * 100 / self.fetch_total))


class PlacementExplanation(models.Model):
    """The scheduler's latest word on one model: placed, or why not, candidate by candidate.

    Kept per model and replaced at each reconcile, so the API, ``ctl explain``
    and the console show the same explanation. Absent means the reconciler
    has not looked at the model yet.
    """

    model = models.OneToOneField(CatalogModel, on_delete=models.CASCADE, related_name="explanation")
    computed_at = models.DateTimeField(default=timezone.now)
    placed = models.BooleanField(default=False, help_text="The model has as many replicas as it wants.")
    rejections = models.JSONField(
        default=list, blank=True, help_text="[{profile, pool, node, reason, nodes}] from the scheduler."
    )
    stale = models.JSONField(
        default=list,
        blank=True,
        help_text="Replicas placed under a profile definition that has changed since: reported, not restarted.",
    )
    start_timeouts = models.JSONField(
        default=list,
        blank=True,
        help_text="[{replica, nodes, at, waited_s, deadline_s, reason}]: the latest replicas failed for not "
        "becoming ready by their start deadline, newest first (placement/writes/startdeadlines.py).",
    )

    class Meta:
        ordering = ["model__name"]

    def __str__(self) -> str:
        return f"{self.model.name}: {'placed' if self.placed else f'{len(self.rejections)} rejections'}"


class Demand(models.Model):
    """A request arrived for a model with no ready replica (an on-demand model, say).

    The reconciler places one replica for it and then forgets the demand; one
    it cannot place is forgotten after ``DEMAND_TTL`` so that a burst of
    requests long gone does not start a replica an hour later. Absent means
    nobody is waiting.
    """

    model = models.OneToOneField(CatalogModel, on_delete=models.CASCADE, related_name="demand")
    requested_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"{self.model.name} wanted at {self.requested_at:%H:%M:%S}"


class LoadReport(models.Model):
    """One gateway worker's load on one model, kept here while Redis does not answer (placement.writes.load).

    Each worker publishes its load every second to Redis, with a time to
    live; when Redis is not configured or fails it writes these rows
    instead, and the autoscaler sums both, taking each worker's newest.
    A row older than ``placement.writes.load.LOAD_TTL_S`` is a worker that
    stopped reporting and counts for nothing. By model name: the gateway
    knows names, and a report must not fail because a model was removed.
    """

    owner = models.CharField(max_length=64, help_text="The gateway worker (host, pid, a random part).")
    model_name = models.CharField(max_length=128)
    in_flight = models.PositiveIntegerField(default=0)
    waiting = models.PositiveIntegerField(default=0, help_text="Requests waiting for a replica to be ready.")
    tokens_per_s = models.FloatField(default=0.0)
    ttft_ms = models.FloatField(null=True, blank=True, help_text="NULL: no request ended in the last window.")
    reported_at = models.DateTimeField(db_index=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["owner", "model_name"], name="loadreport_owner_model")]

    def __str__(self) -> str:
        return f"{self.owner}: {self.model_name} {self.in_flight} in flight"


class Autoscale(models.Model):
    """The autoscaler's latest word on one model, and the history its next decision starts from.

    Written by the reconciler for every model with ``max > min``; in the
    database because several control hosts reconcile in turn. ``reason`` is
    the decision in numbers; the load and the capacity it was taken from sit
    beside it. Absent: the model is not autoscaled, or not looked at yet.
    """

    model = models.OneToOneField(CatalogModel, on_delete=models.CASCADE, related_name="autoscale")
    desired = models.PositiveIntegerField()
    direction = models.CharField(max_length=8, help_text="up, down or hold: what the last decision did.")
    reason = models.TextField()
    decided_at = models.DateTimeField()
    changed_at = models.DateTimeField(null=True, blank=True, help_text="When the desired count last changed.")
    above_since = models.DateTimeField(null=True, blank=True, help_text="Load above the count since (scale-up window).")
    below_since = models.DateTimeField(null=True, blank=True, help_text="Load below the count since (cooldown).")
    replicas = models.PositiveIntegerField(default=0, help_text="Replicas running when decided.")
    in_flight = models.PositiveIntegerField(default=0)
    waiting = models.PositiveIntegerField(default=0)
    tokens_per_s = models.FloatField(default=0.0)
    ttft_ms = models.FloatField(null=True, blank=True)
    workers = models.PositiveIntegerField(default=0, help_text="Gateway workers whose reports were summed.")
    load_source = models.CharField(max_length=16, help_text="redis, database, or redis+database.")
    capacity_profile = models.CharField(max_length=64, blank=True)
    capacity_concurrency = models.PositiveIntegerField(default=0)
    capacity_tokens_per_s = models.FloatField(null=True, blank=True)
    capacity_measured = models.BooleanField(default=False)

    def __str__(self) -> str:
        return f"{self.model.name}: {self.desired} ({self.direction})"


class ScaleEvent(models.Model):
    """One change of a model's desired count by the autoscaler, with its reason: the history shown beside it."""

    model = models.ForeignKey(CatalogModel, on_delete=models.CASCADE, related_name="scale_events")
    at = models.DateTimeField(db_index=True)
    from_replicas = models.PositiveIntegerField()
    to_replicas = models.PositiveIntegerField()
    direction = models.CharField(max_length=8)
    reason = models.TextField()

    class Meta:
        ordering = ["-at", "-id"]

    def __str__(self) -> str:
        return f"{self.model.name}: {self.from_replicas} → {self.to_replicas}"


class NodeLossMove(models.Model):
    """A replica moved off a lost node: what the move rate counts, kept in the database.

    Several control hosts take turns at reconciling; the moves of the last
    minute must be the same count on each, so they are rows, not memory.
    ``replica_id`` is not a key: the replica is deleted once stopped, the row
    stays until it is too old to count (the reconciler deletes those).
    """

    replica_id = models.CharField(max_length=32)
    nodes = models.JSONField(default=list, help_text="The lost nodes it had shards on.")
    lost_at = models.DateTimeField(help_text="When the earliest of those nodes went silent.")
    at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        ordering = ["-at"]

    def __str__(self) -> str:
        return f"{self.replica_id} moved at {self.at:%H:%M:%S}"


class ColdStart(models.Model):
    """One measured start of a shard: how long its fetch and its engine's load took, on which node.

    Written once, when the agent reports the shard ready with its phases
    (placement.writes.shard_status); read to estimate the next start of the
    same model and profile (placement.scheduling.coldstart). Names, not keys,
    for the node and profile: a measurement outlives the replica it timed,
    and a node that is re-registered keeps its history. Only the newest
    ``KEEP`` per model, profile and node are kept.
    """

    KEEP = 20

    model = models.ForeignKey(CatalogModel, on_delete=models.CASCADE, related_name="cold_starts")
    profile_name = models.CharField(max_length=64)
    node = models.CharField(max_length=255)
    replica_id = models.CharField(max_length=32)
    rank = models.PositiveSmallIntegerField(default=0)
    fetch_s = models.FloatField()
    load_s = models.FloatField()
    weights_local = models.BooleanField(help_text="The weights were on the node already: nothing was downloaded.")
    fetch_bytes = models.BigIntegerField(
        null=True, blank=True, help_text="Bytes the fetch brought, as the agent last said; NULL: it did not say."
    )
    at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        ordering = ["-at", "-id"]
        indexes = [models.Index(fields=["model", "profile_name", "-at"], name="coldstart_model_profile_at")]
        constraints = [
            models.UniqueConstraint(fields=["replica_id", "rank"], name="coldstart_once_per_shard"),
            models.CheckConstraint(condition=Q(fetch_s__gte=0) & Q(load_s__gte=0), name="coldstart_nonneg"),
        ]

    def __str__(self) -> str:
        return f"{self.model.name}/{self.profile_name}@{self.node}: {self.fetch_s + self.load_s:.1f} s"
