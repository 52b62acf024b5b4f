"""A sweep that reads only the cards a rule can find something in, and only the SM part of the fabric
analysis, finds exactly what reading every GPU row and analysing every port found.

The reference is the load it replaced: every GPU row as a GpuFact (the loop
below, word for word) and the whole ``analyze_inventory``. The fleet has
something for every rule that reads cards or fabrics: a tray that left its
domain, IMEX down, a tray on another InfiniBand fabric, SM failovers, cards
unhealthy (and in MIG mode with no instances), memory counters that rose now,
a day ago and "in the future", and cards naming a domain in odd spellings.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest
from django.utils import timezone

from agent import nvlink_rules
from agent.simulator import fleet as F
from core.jsonrows import values_decoded_once
from inventory import health_rules
from inventory.fabric_inventory import analyze_inventory
from inventory.models import GPU, Node, NVLinkDomain
from observability import sweeps
from tests.observability.fleet import ingest_fleet, report_again

pytestmark = pytest.mark.django_db

SPEC = "gb200-nvl72:1@north,h100-hgx:3@north,a100-mig:1,cpu:1"


def reference_load(now) -> sweeps.Fleet:
    """sweeps.load as it was: every GPU row, the whole fabric analysis."""
    fleet = sweeps.load(now)
    keys = {
        pk: f"{uuid}/{clique}"
        for pk, uuid, clique in NVLinkDomain.objects.values_list("pk", "cluster_uuid", "clique_id")
    }
    gpus = []
    rows = values_decoded_once(GPU.objects.all(), sweeps.GPU_FACTS, sweeps.GPU_FACTS_JSON)
    for node, index, parent, state, domain_id, uuid, clique, health, ecc, remap, retired, before, changed in (
        r.values() for r in rows
    ):
        gpus.append(
            sweeps.GpuFact(
                node,
                index,
                parent is None,
                state,
                keys.get(domain_id),
                nvlink_rules.claimed_text(uuid, clique),
                tuple(health),
                {"ecc": ecc, "remapped_rows": remap, "retired_pages": retired},
                before,
                changed,
            )
        )
    return replace(fleet, gpus=gpus, fabric_report=analyze_inventory(now))


def varied_fleet(t0) -> dict[str, F.SimNode]:
    sims = ingest_fleet(SPEC, t0)
    F.tray_leave(sims["nvl72-00-tray-03"])
    F.imex_down(sims["nvl72-00-tray-05"])
    F.gpu_lost(sims["hgx-001"], 5)
    odd = sims["nvl72-00-tray-17"]
    for port in odd.ib_ports:
        port["sm_guid"], port["fabric"] = "0x00000000000000aa", "south"
    odd.version += 1
    hgx = sims["hgx-002"]
    hgx.gpus[2]["ecc"]["aggregate"]["dram_correctable"] = 3
    hgx.version += 1
    report_again([sims[n] for n in ("nvl72-00-tray-03", "nvl72-00-tray-05", "hgx-001", "nvl72-00-tray-17")], t0)
    report_again([hgx], t0 + timedelta(seconds=1))
    # Two SM failovers of the north fabric within the hour: flapping.
    north = [n for n in sims if n.startswith("hgx")]
    for seconds, guid in ((2, "0x00000000000000bb"), (600, None)):
        for name in north:
            for port in sims[name].ib_ports:
                port["sm_guid"] = guid or F.build_fleet(SPEC)[18].ib_ports[0]["sm_guid"]
        report_again([sims[n] for n in north], t0 + timedelta(seconds=seconds))
    # Cards of HGX and CPU-less nodes naming a domain in odd spellings, one all zeros and dashes.
    GPU.objects.filter(node__name="hgx-000", index=0).update(cluster_uuid="0 0")
    GPU.objects.filter(node__name="hgx-000", index=1).update(cluster_uuid="[N/A]")
    GPU.objects.filter(node__name="hgx-000", index=2).update(cluster_uuid="--00--")
    GPU.objects.filter(node__name="hgx-000", index=3).update(cluster_uuid="ABC-def", clique_id=None)
    GPU.objects.filter(node__name="hgx-001", index=0).update(health=["MIG enabled but no instances created"])
    # Memory that changed long ago, at the window's edge, and after now.
    changed = GPU.objects.filter(node__name="hgx-002", index=2).values_list("memory_changed_at", flat=True).get()
    GPU.objects.filter(node__name="hgx-000", index=4).update(
        memory_changed_at=changed - timedelta(days=3), previous_memory={"ecc": None}
    )
    GPU.objects.filter(node__name="hgx-001", index=6).update(memory_changed_at=changed + timedelta(hours=2))
    Node.objects.filter(name="cpu-00").update(reachable=False)
    return sims


@pytest.mark.parametrize("later", [30, 3600, health_rules.RISING_WINDOW_S + 1])
def test_the_lean_load_finds_what_every_row_found(later):
    t0 = timezone.now()
    varied_fleet(t0)
    now = t0 + timedelta(seconds=later)
    lean, full = sweeps.load(now), reference_load(now)
    assert sweeps.find(lean, now) == sweeps.find(full, now)
    assert {g.node for g in lean.gpus} < {g.node for g in full.gpus}, "a node's healthy cards unread"
    assert all(g in full.gpus for g in lean.gpus) and len(lean.gpus) < len(full.gpus)
    kinds = {f.kind for f in sweeps.find(full, now)}
    assert {"domain_partly_joined", "imex_down", "domain_split_fabrics", "gpu_unhealthy", "node_silent"} <= kinds
    if later < 3600:
        assert {"sm_changed", "gpu_memory_rising"} <= kinds
    unhealthy = {f.subject for f in sweeps.find(full, now) if f.kind == "gpu_unhealthy"}
    assert unhealthy == {"hgx-001/gpu 5"}, "MIG enabled with no instances is no sick card"
