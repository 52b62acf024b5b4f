"""NVLink domains and InfiniBand/RoCE fabrics."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework.response import Response

from api.base import ApiView, Refused
from api.serializers.common import ERRORS, ErrorSerializer
from api.serializers.fabrics import (
    FabricsSerializer,
    NVLinkSerializer,
    ScanRequestSerializer,
    TopologySerializer,
)
from inventory.reads import fabrics_report, nvlink_report, topology
from inventory.reads.fabrics import analysis
from inventory.writes.scans import request_scan


class NVLinkView(ApiView):
    @extend_schema(
        operation_id="nvlink",
        summary="Each NVLink domain, its nodes and cards, and what keeps any of them out",
        responses={200: NVLinkSerializer, **ERRORS},
    )
    def get(self, request):
        return Response(nvlink_report())


class FabricListView(ApiView):
    @extend_schema(
        operation_id="fabrics",
        summary="The physical fabrics the adapters are on, against the names the nodes gave them",
        responses={200: FabricsSerializer, **ERRORS},
    )
    def get(self, request):
        return Response(fabrics_report())


class TopologyView(ApiView):
    @extend_schema(
        operation_id="fabric_topology",
        summary="One fabric: its subnet managers, problems, and the cluster's adapters on it",
        responses={200: TopologySerializer, 404: ErrorSerializer, **ERRORS},
    )
    def get(self, request, fabric: str):
        view = topology(fabric)
        if view is None:
            raise Refused(404, f"no physical fabric {fabric!r}; `llmgw ctl fabrics` lists them with their ids")
        return Response(view)


class ScanRequestView(ApiView):
    @extend_schema(
        operation_id="fabric_scan",
        summary="Ask for a fresh topology scan of one fabric; its node runs it with its next report",
        request=None,
        responses={202: ScanRequestSerializer, 404: ErrorSerializer, **ERRORS},
    )
    def post(self, request, fabric: str):
        report = analysis()
        physical = report.fabric(fabric)
        if physical is None:
            raise Refused(404, f"no physical fabric {fabric!r}; `llmgw ctl fabrics` lists them with their ids")
        if physical.kind != "infiniband":
            raise Refused(400, f"{physical.label} is a RoCE network; only InfiniBand fabrics are scanned")
        scan = request_scan(physical.key)
        self.audit(request, "scan", physical.key)
        return Response({"fabric": physical.key, "requested_at": scan.requested_at}, status=202)
