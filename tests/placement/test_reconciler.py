"""The reconciler's placement rules, end to end through the database.

Machines are registered through real ingestion of the simulator's captures;
models go in through catalog.writes; each test reconciles and reads back the
Replica, Shard and PlacementExplanation rows an operator would see.
"""

from __future__ import annotations

import pytest

from agent.simulator import fleet as F
from catalog import writes as service
from catalog.models import CatalogModel, Profile
from inventory.models import Node
from placement.models import PlacementExplanation, Shard
from placement.writes.reconciler import reconcile
from tests.placement.dbfleet import fleet, gpu_profile, live, model, nodes_of, register, rereport

pytestmark = pytest.mark.django_db

GB200 = "gb200-186g"


def reasons(model_name: str) -> list[str]:
    explanation = PlacementExplanation.objects.get(model__name=model_name)
    return [f"{r['node']}: {r['reason']}" if r["node"] else r["reason"] for r in explanation.rejections]


def gb200_class() -> str:
    """The class the GB200 capture reports, read back from the inventory rather than assumed."""
    from inventory.models import GPU

    return GPU.objects.filter(node__name__contains="tray").values_list("gpu_class", flat=True).first()


def test_a_tray_that_has_not_joined_is_left_out_and_named():
    sims = fleet("gb200-nvl72:1@north")
    lagging = "nvl72-00-tray-05"
    F.tray_leave(sims[lagging])
    rereport(sims[lagging])
    cls = gb200_class()
    # Seventeen joined trays and one lagging: a 17-node replica fits only without it.
    model("big", gpu_profile(cls, gpus=4, nodes=17))
    model("bigger", gpu_profile(cls, gpus=4, nodes=18))

    reconcile()

    (big,) = live("big")
    assert lagging not in nodes_of(big) and len(nodes_of(big)) == 17
    assert big.nvlink_domain is not None
    env = Shard.objects.get(replica=big, rank=0).env
    assert env["NCCL_MNNVL_ENABLE"] == "1" and env["LLMGW_NNODES"] == "17"
    assert live("bigger") == []
    said = "\n".join(reasons("bigger"))
    assert lagging in said and "cards joined" in said, said


def test_imex_down_excludes_a_tray_with_that_reason():
    sims = fleet("gb200-nvl72:1")
    down = "nvl72-00-tray-02"
    F.imex_down(sims[down])
    rereport(sims[down])
    cls = gb200_class()
    model("whole-rack", gpu_profile(cls, gpus=4, nodes=18))
    model("two-trays", gpu_profile(cls, gpus=4, nodes=2))

    reconcile()

    assert live("whole-rack") == []
    assert any(down in line and "IMEX down" in line for line in reasons("whole-rack")), reasons("whole-rack")
    (two,) = live("two-trays")
    assert down not in nodes_of(two)


def test_a_full_domain_falls_back_to_infiniband_inside_one_fabric():
    sims = fleet("gb200-nvl72:2@north")
    # The second rack's trays all leave their domain: they are left with InfiniBand only.
    for name, sim in sims.items():
        if name.startswith("nvl72-01"):
            F.tray_leave(sim)
            rereport(sim)
    cls = gb200_class()
    model("a-fills-the-domain", gpu_profile(cls, gpus=4, nodes=18))
    model("b-needs-two", gpu_profile(cls, gpus=4, nodes=2))

    reconcile()

    (full,) = live("a-fills-the-domain")
    assert full.nvlink_domain is not None
    (fallback,) = live("b-needs-two")
    assert fallback.nvlink_domain is None and fallback.fabric
    assert all(n.startswith("nvl72-01") for n in nodes_of(fallback))
    assert "NCCL_MNNVL_ENABLE" not in Shard.objects.get(replica=fallback, rank=0).env


def test_a_multi_node_replica_never_spans_two_fabrics():
    fleet("h100-hgx:1@north,h100-hgx:1@south")
    model("two-boxes", gpu_profile("h100-80g", gpus=8, nodes=2))

    reconcile()

    assert live("two-boxes") == []
    assert not PlacementExplanation.objects.get(model__name="two-boxes").placed
    # The same model fits once both boxes are on one fabric: hgx-001 is recabled to the north.
    Node.objects.filter(name="hgx-001").delete()
    register(F.build_fleet("h100-hgx:2@north")[1])
    reconcile()
    (placed,) = live("two-boxes")
    assert sorted(nodes_of(placed)) == ["hgx-000", "hgx-001"]


def test_mig_refused_at_validation_and_in_placement():
    fleet("a100-mig:1")
    from inventory.models import GPU

    # The capture's nvidia-smi predates MIG UUIDs in its XML; an agent with NVML reports them.
    for g in GPU.objects.filter(parent_index__isnull=False):
        g.mig_uuid = f"MIG-{g.uuid.removeprefix('GPU-')}-{g.index}"
        g.save(update_fields=["mig_uuid"])
    mig_class = GPU.objects.filter(parent_index__isnull=False).values_list("gpu_class", flat=True).first()
    with pytest.raises(service.CatalogError) as refused:
        model("two-slices", gpu_profile(mig_class, gpus=2))
    assert refused.value.status == 400 and "MIG instance" in refused.value.message

    # A row written before the rule (or by hand) is refused by placement, with the same words.
    model("one-slice", gpu_profile(mig_class, gpus=1))
    m = CatalogModel.objects.get(name="one-slice")
    Profile.objects.filter(model=m).update(gpus=2, tp=2)
    reconcile()
    assert live("one-slice") == []
    assert any("refused" in line and "MIG instance" in line for line in reasons("one-slice"))

    Profile.objects.filter(model=m).update(gpus=1, tp=1)
    reconcile()
    (slice_,) = live("one-slice")
    shard = Shard.objects.get(replica=slice_)
    assert shard.env["CUDA_VISIBLE_DEVICES"].startswith("MIG-") and shard.gpu_indices[0] >= 1000


def test_a_cordoned_node_takes_nothing_new_and_keeps_what_it_has():
    fleet("h100-hgx:2")
    model("m", gpu_profile("h100-80g", gpus=8), max_replicas=2)
    Node.objects.filter(name="hgx-001").update(state="cordoned")
    reconcile()
    (first,) = live("m")
    assert nodes_of(first) == ["hgx-000"]

    service.scale_model("m", min_replicas=2, max_replicas=2, actor="test")
    reconcile()
    assert len(live("m")) == 1
    assert any("hgx-001" in line and "cordoned" in line for line in reasons("m")), reasons("m")

    Node.objects.filter(name="hgx-000").update(state="cordoned")
    reconcile()
    assert live("m") == [first], "cordoning moves nothing"

    Node.objects.filter(name="hgx-001").update(state="ready")
    reconcile()
    assert len(live("m")) == 2


def test_a_cpu_model_lands_on_a_cpu_node_with_no_gpus_visible():
    fleet("cpu:1,h100-hgx:1")
    model("small", {"name": "cpu", "engine": "llamacpp", "gpu_class": "cpu", "memory_gb": 4, "gpus": 0})
    reconcile()
    (r,) = live("small")
    assert nodes_of(r) == ["cpu-00"]
    assert Shard.objects.get(replica=r).env["CUDA_VISIBLE_DEVICES"] == ""
