"""The fabric analysis over what is stored: IBPort and SubnetManagerChange rows in, a FabricReport out.

The analysis itself is pure (fabrics.py); this is the one place that turns
rows into its input, so the API, the pages, the sweeps and placement read the
same answer.
"""

from __future__ import annotations

from datetime import datetime

from django.utils import timezone

from inventory.fabrics import FabricReport, PortFacts, SMChange, analyze
from inventory.models import IBPort, SubnetManagerChange

SM_HISTORY_DAYS = 7


def _blank(value: str) -> str | None:
    return value or None


def port_facts(port: IBPort, node_name: str) -> PortFacts:
    return PortFacts(
        node=node_name,
        hca=port.hca,
        port=port.port,
        state=_blank(port.state),
        phys_state=_blank(port.phys_state),
        rate_gbps=port.rate_gbps,
        link_layer=_blank(port.link_layer),
        node_guid=_blank(port.node_guid),
        port_guid=_blank(port.port_guid),
        sm_lid=port.sm_lid,
        sm_guid=_blank(port.sm_guid),
        sm_error=_blank(port.sm_error),
        network=_blank(port.network),
        declared_fabric=_blank(port.fabric),
        counters=port.counters or None,
        previous_counters=port.previous_counters,
    )


def analyze_inventory(now: datetime | None = None) -> FabricReport:
    """Analyse every stored port; two queries whatever the fleet's size."""
    now = now or timezone.now()
    ports = [
        port_facts(p, p.node.name)
        for p in IBPort.objects.select_related("node").only(
            "hca",
            "port",
            "state",
            "phys_state",
            "rate_gbps",
            "link_layer",
            "node_guid",
            "port_guid",
            "sm_lid",
            "sm_guid",
            "sm_error",
            "network",
            "fabric",
            "counters",
            "previous_counters",
            "node__name",
        )
    ]
    since = now - timezone.timedelta(days=SM_HISTORY_DAYS)
    changes = [
        SMChange(
            node=c.node.name, hca=c.hca, port=c.port, old=_blank(c.old_sm_guid), new=_blank(c.new_sm_guid), at=c.at
        )
        for c in SubnetManagerChange.objects.filter(at__gte=since).select_related("node")
    ]
    return analyze(ports, changes, now)
