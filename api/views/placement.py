"""Replicas, why a model is (not) placed, and what losing parts of the fleet would do."""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.response import Response

from api.base import ApiView, Refused
from api.serializers.common import ERRORS, ErrorSerializer
from api.serializers.placement import ExplainSerializer, ReplicaSerializer, WhatIfSerializer
from catalog import writes as service
from placement.reads import explain, replica_list
from placement.what_if_reads import WhatIfRefused, what_if

MODEL_PARAM = OpenApiParameter("model", OpenApiTypes.STR, description="A model's name or alias.")


def known_model(name: str):
    model = service.resolve(name)
    if model is None:
        raise Refused(404, f"no model named {name!r} is in the catalog; `llmgw ctl models` lists them")
    return model


class ReplicaListView(ApiView):
    @extend_schema(
        operation_id="replicas",
        summary="Every replica, or one model's, with shards and downloads in flight",
        parameters=[MODEL_PARAM],
        responses={200: ReplicaSerializer(many=True), 404: ErrorSerializer, **ERRORS},
    )
    def get(self, request):
        name = request.query_params.get("model") or None
        return Response(replica_list(known_model(name).name if name else None))


class ExplainView(ApiView):
    @extend_schema(
        operation_id="explain_placement",
        summary="Why a model is placed or not: each candidate the scheduler turned down, and why",
        parameters=[OpenApiParameter("model", OpenApiTypes.STR, required=True, description="A model's name or alias.")],
        responses={200: ExplainSerializer, 404: ErrorSerializer, **ERRORS},
    )
    def get(self, request):
        name = request.query_params.get("model")
        if not name:
            raise Refused(400, "say which model: ?model=NAME")
        return Response(explain(known_model(name)))


class WhatIfView(ApiView):
    @extend_schema(
        operation_id="what_if",
        summary="What losing nodes, an NVLink domain, a fabric or a labelled group would do; changes nothing",
        parameters=[
            OpenApiParameter(
                "lose",
                OpenApiTypes.STR,
                required=True,
                many=True,
                explode=True,
                description=(
                    "A node's name, an NVLink domain's key (ClusterUUID/CliqueId) or name, an InfiniBand "
                    "fabric's key, id or declared name, or LABEL=VALUE; repeat it or separate with commas."
                ),
            )
        ],
        responses={200: WhatIfSerializer, **ERRORS},
    )
    def get(self, request):
        try:
            return Response(what_if(request.query_params.getlist("lose")))
        except WhatIfRefused as exc:
            raise Refused(400, str(exc)) from None
