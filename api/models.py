"""Requests the API records for the agents to act on."""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.utils import timezone


class WeightCollection(models.Model):
    """Orphaned weights an operator asked to have deleted from a node's disk.

    One row per node and path. The agent is told at its heartbeat and reports
    back (``done_at``, or ``error``); until then the row is pending, and
    asking again does not add a second one. Recorded by node name rather than
    by foreign key so the request survives the node re-registering.
    """

    node = models.CharField(max_length=200, db_index=True)
    path = models.CharField(max_length=1000)
    name = models.CharField(max_length=500, blank=True)
    bytes = models.BigIntegerField(null=True, blank=True, help_text="NULL: the agent did not report the size.")
    requested_at = models.DateTimeField(default=timezone.now, db_index=True)
    requested_by = models.CharField(max_length=200)
    done_at = models.DateTimeField(null=True, blank=True)
    error = models.TextField(blank=True)

    class Meta:
        ordering = ["-requested_at", "node", "path"]
        constraints = [
            models.UniqueConstraint(
                fields=["node", "path"], condition=Q(done_at__isnull=True), name="weightcollection_one_pending"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.node}:{self.path}"

    @property
    def pending(self) -> bool:
        return self.done_at is None
