"""Weights on disk that no model refers to: listed by one verb, collected by another.

Listing is a read and collecting is a separate POST, so a mistyped command
cannot remove anything. Collecting records the request, one row per node and
path, for the agents to act on; it answers what will be collected.
"""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework.response import Response

from api.base import ApiView, Refused
from api.serializers.common import ERRORS, WRITE_ERRORS
from api.serializers.weights import CollectRequestSerializer, CollectSerializer, OrphansSerializer
from catalog.models import WeightCollection
from catalog.reads import orphan_totals, orphan_weights
from catalog.weights import cancel_referred
from inventory.models import Node

COLLECT_NOTE = (
    "Recorded for each node's agent, which deletes the weights unless a model refers to them again by then "
    "(the request is then cancelled) or a shard on that node uses them; weights a model refers to are never collected."
)


class OrphansView(ApiView):
    @extend_schema(
        operation_id="orphans",
        summary="Weights on nodes' disks that no catalog model's source refers to",
        responses={200: OrphansSerializer, **ERRORS},
    )
    def get(self, request):
        orphans = orphan_weights()
        return Response({"orphans": orphans, **orphan_totals(orphans)})


class CollectView(ApiView):
    @extend_schema(
        operation_id="collect_weights",
        summary="Ask the agents to delete the orphaned weights (all nodes, or the ones named)",
        request=CollectRequestSerializer,
        responses={200: CollectSerializer, **WRITE_ERRORS},
    )
    def post(self, request):
        nodes = _nodes(self.body(request).get("nodes"))
        orphans = [o for o in orphan_weights() if nodes is None or o["node"] in nodes]
        actor, now = self.actor(request), timezone.now()
        with transaction.atomic():
            cancel_referred()  # what was asked for before and is used again is not left pending
            pending = set(
                WeightCollection.objects.filter(
                    done_at__isnull=True, node__in={o["node"] for o in orphans}
                ).values_list("node", "path")
            )
            WeightCollection.objects.bulk_create(
                WeightCollection(
                    node=o["node"],
                    path=o["path"],
                    name=o.get("name", "")[:500],
                    bytes=o.get("bytes"),
                    requested_at=now,
                    requested_by=actor,
                )
                for o in orphans
                if (o["node"], o["path"]) not in pending
            )
            totals = orphan_totals(orphans)
            self.audit(request, "collect-weights", ",".join(sorted(nodes)) if nodes else "all nodes", **totals)
        return Response(
            {
                "orphans": orphans,
                **totals,
                "requested_at": now.isoformat(),
                "requested_by": actor,
                "already_pending": sum(1 for o in orphans if (o["node"], o["path"]) in pending),
                "note": COLLECT_NOTE,
            }
        )


def _nodes(value) -> set[str] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise Refused(400, 'nodes must be a list of node names, like ["hgx-001"]; leave it out for every node')
    known = set(Node.objects.filter(name__in=value).values_list("name", flat=True))
    unknown = sorted(set(value) - known)
    if unknown:
        raise Refused(404, f"no node named {', '.join(map(repr, unknown))}; `llmgw ctl nodes` lists them")
    return set(value)
