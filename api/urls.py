"""``/api/v1/``: the admin API (the agent endpoints under ``agent/`` are routed before this)."""

from django.urls import path, re_path

from api.views import catalog, fabrics, fleet, nodes, placement, tenancy, weights

urlpatterns = [
    path("summary", fleet.SummaryView.as_view(), name="api-summary"),
    path("moves/resume", fleet.ResumeMovesView.as_view(), name="api-moves-resume"),
    path("nodes", nodes.NodeListView.as_view(), name="api-nodes"),
    path("nodes/<str:name>", nodes.NodeDetailView.as_view(), name="api-node"),
    path("nodes/<str:name>/state", nodes.NodeStateView.as_view(), name="api-node-state"),
    path("nodes/<str:name>/logs", nodes.NodeLogsView.as_view(), name="api-node-logs"),
    path("models", catalog.ModelListView.as_view(), name="api-models"),
    path("models/<str:name>", catalog.ModelView.as_view(), name="api-model"),
    path("models/<str:name>/scale", catalog.ScaleView.as_view(), name="api-model-scale"),
    path("models/<str:name>/capacity", catalog.CapacityView.as_view(), name="api-model-capacity"),
    path("models/<str:name>/prefetch", catalog.PrefetchView.as_view(), name="api-model-prefetch"),
    path("capacity", catalog.CapacityListView.as_view(), name="api-capacity"),
    path("replicas", placement.ReplicaListView.as_view(), name="api-replicas"),
    path("explain-placement", placement.ExplainView.as_view(), name="api-explain"),
    path("what-if", placement.WhatIfView.as_view(), name="api-what-if"),
    path("nvlink", fabrics.NVLinkView.as_view(), name="api-nvlink"),
    path("fabrics", fabrics.FabricListView.as_view(), name="api-fabrics"),
    path("fabrics/<str:fabric>/topology", fabrics.TopologyView.as_view(), name="api-fabric-topology"),
    path("fabrics/<str:fabric>/scan", fabrics.ScanRequestView.as_view(), name="api-fabric-scan"),
    path("weights/orphans", weights.OrphansView.as_view(), name="api-orphans"),
    path("weights/collect", weights.CollectView.as_view(), name="api-collect"),
    path("keys", tenancy.KeysView.as_view(), name="gateway-keys"),
    path("keys/<str:key_id>/revoke", tenancy.RevokeView.as_view(), name="gateway-key-revoke"),
    path("budgets", tenancy.BudgetsView.as_view(), name="gateway-budgets"),
    path("usage", tenancy.UsageView.as_view(), name="gateway-usage"),
    re_path(r"^.*$", fleet.NotFoundView.as_view(), name="api-not-found"),
]
