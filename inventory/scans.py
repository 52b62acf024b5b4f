"""Topology scans: which node maps which fabric, when, and what came back.

Steps, each time a node sends its full report:

1. Analyse the fabrics (fabric_inventory) to know the physical fabrics.
2. For each fabric whose map is older than ``SCAN_EVERY_S``, or that an
   operator asked to scan, choose one reachable node with an active port on
   it (the same node as last time when it still qualifies, so one node does
   the work and the others never run a scan at once).
3. If that node is the one reporting, its answer carries the scan request;
   the agent runs ``ibnetdiscover`` on that port and uploads the output.
4. An upload is parsed before it is kept. A failure keeps the last good map
   and records the error and the time.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone

from inventory.fabric_inventory import analyze_inventory
from inventory.ibnetdiscover import TopologyParseError, parse
from inventory.models import FabricScan, IBPort, Node

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


def scan_for(node: Node, now: datetime) -> dict | None:
    """The scan this node should run now, if any: {"fabric", "hca", "port"}."""
    if not IBPort.objects.filter(node=node, link_layer="InfiniBand").exists():
        return None
    report = analyze_inventory(now)
    scans = {s.fabric_key: s for s in FabricScan.objects.select_related("node")}
    reachable = set(Node.objects.filter(reachable=True).values_list("name", flat=True))
    for fabric in report.physical:
        if fabric.kind != "infiniband" or not _due(scans.get(fabric.key), now):
            continue
        ports = sorted((p.node, p.hca, p.port) for p in fabric.ports if p.node in reachable)
        if not ports:
            continue
        scan = scans.get(fabric.key)
        keeper = scan.node.name if scan and scan.node and any(n == scan.node.name for n, _, _ in ports) else ports[0][0]
        if keeper != node.name:
            continue
        hca, port = next((h, p) for n, h, p in ports if n == node.name)
        FabricScan.objects.update_or_create(
            fabric_key=fabric.key, defaults={"node": node, "hca": hca, "port": port, "pending_since": now}
        )
        return {"fabric": fabric.key, "hca": hca, "port": port}
    return None


@transaction.atomic
def record_scan(node: Node, body: dict, now: datetime) -> FabricScan:
    """Keep an uploaded scan; a failed or unreadable one keeps the previous map and says why."""
    scan, _ = FabricScan.objects.select_for_update().get_or_create(fabric_key=body["fabric"])
    scan.node, scan.hca, scan.port = node, body.get("hca", ""), body.get("port")
    scan.attempted_at, scan.pending_since = now, None
    output, error = body.get("output"), body.get("error")
    if not error:
        try:
            parse(output or "")
        except TopologyParseError as exc:
            error = f"the uploaded map could not be read: {exc}"
    if error:
        scan.error = str(error)[:2000]
    else:
        scan.output, scan.scanned_at, scan.error = output, now, ""
        scan.took_ms = body.get("took_ms")
        scan.requested_at = None
    scan.save()
    return scan


def request_scan(fabric_key: str) -> FabricScan:
    scan, _ = FabricScan.objects.get_or_create(fabric_key=fabric_key)
    scan.requested_at = timezone.now()
    scan.save(update_fields=["requested_at"])
    return scan
