"""Nodes: the list, one node, cordon/uncordon/drain, and the engines' last log lines."""

from __future__ import annotations

import logging

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.response import Response

from api.base import ApiView, Refused, dumps, streamed_list
from api.serializers.common import ERRORS, WRITE_ERRORS, ErrorSerializer
from api.serializers.nodes import (
    NodeDetailSerializer,
    NodeListedSerializer,
    NodeLogsSerializer,
    NodeSerializer,
    NodeStateRequestSerializer,
    NodeStateSerializer,
)
from inventory.reads import node_logs
from inventory.writes.states import NodeStateError, set_node_state
from placement.reads import node_detail, node_pages_json

log = logging.getLogger(__name__)


def no_node(name: str) -> Refused:
    return Refused(404, f"no node named {name!r}; `llmgw ctl nodes` lists them")


def listed_fields(asked: str | None) -> frozenset[str] | None:
    """The ``?fields=`` of the node listing as a set of its top-level names; None (all of them) when not asked."""
    if asked is None:
        return None
    names = frozenset(n.strip() for n in asked.split(",") if n.strip())
    known = set(NodeSerializer().fields)
    if unknown := sorted(names - known):
        raise Refused(400, f"fields: a node has no field {unknown[0]!r}; it has {', '.join(sorted(known))}")
    if not names:
        raise Refused(400, "fields: name at least one field, e.g. ?fields=id,state,gpu_free")
    return names


class NodeListView(ApiView):
    @extend_schema(
        operation_id="nodes",
        summary="Every node",
        parameters=[
            OpenApiParameter(
                "fields",
                OpenApiTypes.STR,
                description="Comma-separated top-level fields to keep, e.g. id,state,gpu_free (default: all).",
            )
        ],
        responses={200: NodeListedSerializer(many=True), **ERRORS},
    )
    def get(self, request):
        # Streamed a page of nodes at a time: the full listing of a large fleet is megabytes. Each
        # node comes as its JSON, what nodes share encoded once (placement.reads.node_pages_json).
        fields = listed_fields(request.query_params.get("fields"))
        return streamed_list(request, node_pages_json(dumps, fields=fields), encoded=True)


class NodeDetailView(ApiView):
    @extend_schema(
        operation_id="node",
        summary="One node: its cards and how they are wired, its ports, its shards",
        responses={200: NodeDetailSerializer, 404: ErrorSerializer, **ERRORS},
    )
    def get(self, request, name: str):
        view = node_detail(name)
        if view is None:
            raise no_node(name)
        return Response(view)


class NodeStateView(ApiView):
    """cordon, uncordon and drain: one endpoint, since they are one operation with different targets.

    Cordon stops new placement; drain also moves existing replicas off
    (replacement first). Placement is told at once rather than at its next
    tick: an operator draining a node is usually about to do something to it.
    """

    @extend_schema(
        operation_id="set_node_state",
        summary="Cordon, uncordon or drain a node",
        request=NodeStateRequestSerializer,
        responses={200: NodeStateSerializer, **WRITE_ERRORS},
    )
    def post(self, request, name: str):
        word = self.body(request).get("state")
        try:
            previous, state = set_node_state(name, word, actor=self.actor(request), detail=self.caller(request))
        except NodeStateError as exc:
            raise Refused(exc.status, exc.message) from None
        return Response({"id": name, "state": state, "previous": previous})


class NodeLogsView(ApiView):
    @extend_schema(
        operation_id="node_logs",
        summary="The last lines each engine on the node wrote, as its agent last sent them",
        parameters=[
            OpenApiParameter("shard", OpenApiTypes.STR, description="One shard, by its id or its replica's id.")
        ],
        responses={200: NodeLogsSerializer, 404: ErrorSerializer, **ERRORS},
    )
    def get(self, request, name: str):
        shard = request.query_params.get("shard") or None
        view = node_logs(name, shard)
        if view is None:
            raise no_node(name)
        if shard and not view["shards"]:
            raise Refused(404, f"node {name!r} reports no shard {shard!r}; `llmgw ctl node {name}` lists its shards")
        return Response(view)
