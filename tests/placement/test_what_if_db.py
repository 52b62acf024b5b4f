"""The what-if through the database: today's fleet as the reconciler reads it, the answer, and nothing written.

The fleet is a GB200 NVL72 rack and HGX boxes registered through real
ingestion, with replicas the real reconciler placed; the question is asked
through ``placement.what_if_reads.what_if``, as the API and the console ask it.
"""

from __future__ import annotations

import pytest
from django.apps import apps
from django.db import connection
from django.test.utils import CaptureQueriesContext

from inventory.models import GPU, Node, NVLinkDomain
from placement import what_if_reads
from placement.writes.reconciler import reconcile
from tests.placement.dbfleet import fleet, gpu_profile, live, model, nodes_of

pytestmark = pytest.mark.django_db


def gb200_class() -> str:
    return GPU.objects.filter(node__name__contains="tray").values_list("gpu_class", flat=True).first()


@pytest.fixture
def placed():
    """A rack and three HGX boxes on fabric north; a two-tray replica in the rack and a two-GPU one on HGX."""
    fleet("gb200-nvl72:1@north,h100-hgx:3@north")
    model("big", gpu_profile(gb200_class(), gpus=4, nodes=2, name="nvl"), gpu_profile("h100-80g", 8, 2, name="ib"))
    model("small", gpu_profile("h100-80g", gpus=2))
    reconcile()
    (big,) = live("big")
    (small,) = live("small")
    return big, small


def row_counts() -> dict[str, int]:
    return {m._meta.label: m.objects.count() for m in apps.get_models()}


def test_losing_the_rack_moves_its_replica_to_infiniband_and_writes_nothing(placed):
    big, _ = placed
    domain = NVLinkDomain.objects.get()
    before = row_counts()
    with CaptureQueriesContext(connection) as queries:
        answer = what_if_reads.what_if([domain.key])
    assert row_counts() == before
    writes = [q["sql"] for q in queries if not q["sql"].lstrip().upper().startswith(("SELECT", "SAVEPOINT", "RELEASE"))]
    assert writes == []
    assert answer["lose"][0]["kind"] == "nvlink_domain" and len(answer["lost_nodes"]) == 18
    (stopped,) = answer["stopped"]
    assert stopped["replica"] == big.id and set(stopped["lost_nodes"]) == set(nodes_of(big))
    to = stopped["to"]
    assert to["profile"] == "ib" and to["interconnect"] == "infiniband" and to["fabric"]
    assert all(n.startswith("hgx-") for n in to["nodes"])
    assert answer["short"] == [] and answer["moves"] == {"count": 1, "per_minute": 20, "minutes": 1}


def test_a_tray_lost_keeps_the_replica_inside_its_nvlink_domain(placed):
    big, _ = placed
    answer = what_if_reads.what_if([nodes_of(big)[0]])
    (stopped,) = answer["stopped"]
    assert stopped["to"]["interconnect"] == "nvlink"
    assert stopped["to"]["nvlink_domain"] == NVLinkDomain.objects.get().key


def test_labels_fabric_names_and_comma_lists_are_targets(placed, monkeypatch):
    _, small = placed
    Node.objects.filter(name__startswith="hgx-").update(labels={"row": "b"})
    by_label = what_if_reads.what_if(["row=b"])
    assert by_label["lose"][0]["kind"] == "label" and len(by_label["lost_nodes"]) == 3
    (stopped,) = by_label["stopped"]
    assert stopped["replica"] == small.id
    # Everything on fabric north, by the name its nodes declared: nothing is left to take either model.
    by_fabric = what_if_reads.what_if(["north"])
    assert by_fabric["lose"][0]["kind"] == "fabric" and len(by_fabric["lost_nodes"]) == 21
    assert {s["model"] for s in by_fabric["short"]} == {"big", "small"}
    assert all(s["reasons"] for s in by_fabric["short"])
    monkeypatch.setenv("LLMGW_MOVES_PER_MINUTE", "1")
    both = what_if_reads.what_if([f"{nodes_of(small)[0]},{nodes_of(placed[0])[0]}"])
    assert [t["target"] for t in both["lose"]] == [nodes_of(small)[0], nodes_of(placed[0])[0]]
    assert both["moves"] == {"count": 2, "per_minute": 1, "minutes": 2}


@pytest.mark.parametrize(
    ("lose", "says"),
    [
        ([], "say what to lose"),
        (["hgx-000", "nvl72-99"], "'nvl72-99' is not a node"),
        (["pool=nowhere"], "no node has the label pool='nowhere'"),
    ],
)
def test_a_question_that_names_nothing_is_refused_with_a_sentence(placed, lose, says):
    with pytest.raises(what_if_reads.WhatIfRefused) as caught:
        what_if_reads.what_if(lose)
    assert says in str(caught.value)


def test_a_node_lost_already_is_said_so(placed):
    Node.objects.filter(name="hgx-002").update(lost=True)
    with pytest.raises(what_if_reads.WhatIfRefused, match="lost already"):
        what_if_reads.what_if(["hgx-002"])
