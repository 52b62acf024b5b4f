"""The fleet at a glance, and what the API does with a path it does not know."""

from __future__ import annotations

from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework.response import Response

from api.base import ApiView, Refused
from api.serializers.common import ERRORS, WRITE_ERRORS
from api.serializers.fleet import ResumeMovesSerializer, SummarySerializer
from inventory.writes.partitions import resume_moves
from observability import fleet_summary


class SummaryView(ApiView):
    @extend_schema(
        operation_id="summary",
        summary="The whole fleet in one answer",
        responses={200: SummarySerializer, **ERRORS},
    )
    def get(self, request):
        return Response(fleet_summary.summary())


class ResumeMovesView(ApiView):
    """An operator ends every open partition: its nodes still silent are lost at the next sweep and their
    replicas moved at the normal rate (``LLMGW_MOVES_PER_MINUTE``). Audited as ``resume-moves``."""

    @extend_schema(
        operation_id="resume_moves",
        summary="End every partition: moves off its silent nodes resume at the normal rate",
        request=None,
        responses={200: ResumeMovesSerializer, **WRITE_ERRORS},
    )
    def post(self, request):
        ended = resume_moves(actor=self.actor(request), now=timezone.now(), detail=self.caller(request))
        return Response({"resumed": ended})


class NotFoundView(ApiView):
    """Any other path under /api/v1/: a JSON sentence rather than an HTML page, and only for a caller with a token."""

    schema = None

    def handle(self, request, *args, **kwargs):
        raise Refused(404, f"there is no {request.path} in the admin API; its endpoints are listed at /api/v1/schema")

    get = post = put = patch = delete = handle
