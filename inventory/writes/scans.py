"""Topology scans: which node maps which fabric, when, and what came back.

Steps:

1. Once a minute (``inventory.tasks.plan_scans``) the physical fabrics are read,
   and for each fabric whose map is older than ``LLMGW_SCAN_EVERY_S``, or that
   an operator asked to scan, one reachable node with an active port on it is
   assigned the scan (the same node as last time when it still qualifies, so
   one node does the work and the others never scan at once).
2. When that node next sends its full report, the answer carries the scan
   request (one indexed query: nothing is analysed on the report's path), and
   the scan is marked pending.
3. The agent runs ``ibnetdiscover`` on that port and uploads the output.
   An upload is taken only from the node the fabric's scan is assigned to,
   while it is assigned (``accept_upload``); anything else is refused and
   changes nothing, so no node can overwrite another fabric's map or clear an
   operator's request to rescan. The adapter and port are the assignment's,
   whatever the upload says.
4. A kept upload is parsed once, then and there: the parsed map is stored
   beside the text (``fabric_map``) and pages read that. A failure keeps the
   last good map and records the error and the time. A scan handed out and
   never answered is assigned again after ``PENDING_TIMEOUT``.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone

from inventory.fabric_inventory import physical_fabric_ports
from inventory.fabrics import fabric_kind
from inventory.ibnetdiscover import TopologyParseError, map_to_json, parse
from inventory.models import FabricScan, Node
from inventory.report_schema import unstorable

SCAN_LIMIT = 16 * 1024 * 1024
# A scan that was handed out but not answered is handed out again after this.
PENDING_TIMEOUT = timedelta(minutes=10)


def scan_every() -> timedelta:
    return timedelta(seconds=float(os.environ.get("LLMGW_SCAN_EVERY_S", 3600)))


def _due(scan: FabricScan | None, now: datetime) -> bool:
    if scan is None:
        return True
    if scan.pending_since is not None and now - scan.pending_since < PENDING_TIMEOUT:
        return False  # handed out and not answered yet
    if scan.requested_at is not None or scan.scanned_at is None:
        return True
    last = max(filter(None, [scan.scanned_at, scan.attempted_at]))
    return now - last >= scan_every()


def plan_scans(now: datetime) -> list[str]:
    """Assign each due fabric's scan to one node; returns the fabrics assigned."""
    # Only each fabric's key and ports: the rest of the analysis (names, counters, problems) is not read here.
    fabrics = physical_fabric_ports()
    scans = {s.fabric_key: s for s in FabricScan.objects.select_related("node")}
    reachable = set(Node.objects.filter(reachable=True).values_list("name", flat=True))
    nodes = dict(Node.objects.filter(name__in=reachable).values_list("name", "pk"))
    assigned = []
    for key, refs in sorted(fabrics.items()):
        scan = scans.get(key)
        if fabric_kind(key) != "infiniband" or not _due(scan, now):
            continue
        ports = sorted((p.node, p.hca, p.port) for p in refs if p.node in reachable)
        if not ports:
            continue
        keeper = scan.node.name if scan and scan.node and any(n == scan.node.name for n, _, _ in ports) else ports[0][0]
        hca, port = next((h, p) for n, h, p in ports if n == keeper)
        FabricScan.objects.update_or_create(
            fabric_key=key,
            defaults={"node_id": nodes[keeper], "hca": hca, "port": port, "assigned_at": now, "pending_since": None},
        )
        assigned.append(key)
    return assigned


def scan_for(node: Node, now: datetime) -> dict | None:
    """The scan assigned to this node and not yet handed out, if any: {"fabric", "hca", "port"}."""
    scan = FabricScan.objects.filter(node=node, assigned_at__isnull=False, pending_since__isnull=True).first()
    if scan is None:
        return None
    FabricScan.objects.filter(pk=scan.pk).update(pending_since=now)
    return {"fabric": scan.fabric_key, "hca": scan.hca, "port": scan.port}


ERROR_KEPT = 2000
TOOK_MS_MAX = 2**31 - 1  # FabricScan.took_ms is a PositiveIntegerField


class UploadRefused(ValueError):
    """An upload that is not stored; ``status`` is the HTTP status to answer, the message a sentence."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def upload_problem(body: object) -> str | None:
    """What is wrong with an upload's shape, or None: checked before anything is read or written."""
    if not isinstance(body, dict) or not isinstance(body.get("fabric"), str):
        return "a scan upload is an object with the fabric it was asked for, and output or error"
    problems: list[str] = []
    unstorable(body, "scan", problems)
    if problems:
        return "; ".join(problems)
    key_max = FabricScan._meta.get_field("fabric_key").max_length
    if len(body["fabric"]) > key_max:
        return f"scan.fabric is {len(body['fabric'])} characters; no fabric key is longer than {key_max}"
    if not isinstance(body.get("output", ""), str) or not isinstance(body.get("error", ""), str):
        return "output and error must be text"
    if not body.get("output") and not body.get("error"):
        return "a scan upload needs the output of ibnetdiscover, or the error it ended with"
    took = body.get("took_ms")
    if took is not None and not (isinstance(took, int) and not isinstance(took, bool) and 0 <= took <= TOOK_MS_MAX):
        return f"scan.took_ms must be a whole number of milliseconds from 0 to {TOOK_MS_MAX}"
    return None


@transaction.atomic
def accept_upload(node: Node, body: object, now: datetime) -> FabricScan:
    """Keep an upload from ``node`` if that node was assigned this fabric's scan; else raise UploadRefused."""
    problem = upload_problem(body)
    if problem:
        raise UploadRefused(400, problem)
    assert isinstance(body, dict)
    scan = (
        FabricScan.objects.select_for_update()
        .filter(fabric_key=body["fabric"], node=node, assigned_at__isnull=False)
        .first()
    )
    if scan is None:
        raise UploadRefused(
            409,
            f"this node was not asked to scan {body['fabric']!r}, or its answer already came; nothing was stored",
        )
    return record_scan(node, {**body, "hca": scan.hca, "port": scan.port}, now)


@transaction.atomic
def record_scan(node: Node, body: dict, now: datetime) -> FabricScan:
    """Keep a scan (checked by accept_upload); a failed or unreadable one keeps the last map and says why."""
    scan, _ = FabricScan.objects.select_for_update().get_or_create(fabric_key=body["fabric"])
    scan.node, scan.hca, scan.port = node, body.get("hca") or "", body.get("port")
    scan.attempted_at, scan.pending_since, scan.assigned_at = now, None, None
    output, error = body.get("output"), body.get("error")
    fabric_map = None
    if not error:
        try:
            fabric_map = map_to_json(parse(output or ""))
        except TopologyParseError as exc:
            error = f"the uploaded map could not be read: {exc}"
    if error:
        scan.error = str(error)[:ERROR_KEPT]
    else:
        scan.output, scan.fabric_map, scan.scanned_at, scan.error = output, fabric_map, now, ""
        scan.took_ms = body.get("took_ms")
        scan.requested_at = None
    scan.save()
    return scan


def request_scan(fabric_key: str) -> FabricScan:
    scan, _ = FabricScan.objects.get_or_create(fabric_key=fabric_key)
    scan.requested_at = timezone.now()
    scan.save(update_fields=["requested_at"])
    return scan
