"""Nodes: the list, one node, cordon/uncordon/drain, and the engines' last log lines."""

from __future__ import annotations

import importlib
import logging

from django.db import transaction
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.response import Response

from inventory.models import Node, NodeState
from inventory.views_data import node_detail, node_list, node_logs
from llmgw.api.base import ApiView, Refused
from llmgw.api.serializers.common import ERRORS, WRITE_ERRORS, ErrorSerializer
from llmgw.api.serializers.nodes import (
    NodeDetailSerializer,
    NodeLogsSerializer,
    NodeSerializer,
    NodeStateRequestSerializer,
    NodeStateSerializer,
)

log = logging.getLogger(__name__)

# What each word an operator may send means; the verbs are what ctl sends, the states what the API shows.
STATES = {
    "cordon": NodeState.CORDONED,
    "cordoned": NodeState.CORDONED,
    "uncordon": NodeState.READY,
    "ready": NodeState.READY,
    "drain": NodeState.DRAINING,
    "draining": NodeState.DRAINING,
}
ACTIONS = {NodeState.READY: "uncordon", NodeState.CORDONED: "cordon", NodeState.DRAINING: "drain"}


def no_node(name: str) -> Refused:
    return Refused(404, f"no node named {name!r}; `llmgw ctl nodes` lists them")


class NodeListView(ApiView):
    @extend_schema(operation_id="nodes", summary="Every node", responses={200: NodeSerializer(many=True), **ERRORS})
    def get(self, request):
        return Response(node_list())


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
        if not isinstance(word, str) or word.strip().lower() not in STATES:
            raise Refused(400, f"state must be one of cordon, uncordon or drain (got {word!r})")
        state = STATES[word.strip().lower()]
        with transaction.atomic():
            node = Node.objects.select_for_update().filter(name=name).first()
            if node is None:
                raise no_node(name)
            previous = node.state
            if previous != state:
                Node.objects.filter(pk=node.pk).update(state=state)
            self.audit(request, ACTIONS[state], name, previous=previous, state=state)
        node_state_changed(name)
        return Response({"id": name, "state": state, "previous": previous})


def node_state_changed(name: str) -> None:
    """Tell placement a node's state changed, when the placement piece provides the hook."""
    try:
        signals = importlib.import_module("placement.signals")
    except ImportError:
        return
    hook = getattr(signals, "node_state_changed", None)
    if hook is None:
        return
    try:
        hook(name)
    except Exception:
        log.exception("placement.signals.node_state_changed(%r) failed", name)


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
