"""What the gateway tells placement about use: a model asked for, a replica used.

Both are cheap and safe to call on the request path: one small write each,
and neither fails the request when the model or replica has gone meanwhile.
"""

from __future__ import annotations

from datetime import datetime

from django.db.models import Q
from django.utils import timezone

from catalog.models import CatalogModel
from placement import signals
from placement.models import Demand, Replica


def request_replica(model_name: str) -> None:
    """A request arrived for a model with no ready replica: place one (an on-demand model's start).

    Unknown model names are ignored; the gateway has already answered 404.
    """
    model_id = CatalogModel.objects.filter(name=model_name).values_list("pk", flat=True).first()
    if model_id is None:
        return
    Demand.objects.update_or_create(model_id=model_id, defaults={"requested_at": timezone.now()})
    signals.reconcile_soon(f"a request is waiting for {model_name}")


def touch(replica_id: str, at: datetime) -> None:
    """A request was routed to this replica at ``at``: it is not idle. Never moves the time backwards."""
    Replica.objects.filter(id=replica_id).filter(Q(last_used_at__isnull=True) | Q(last_used_at__lt=at)).update(
        last_used_at=at
    )
