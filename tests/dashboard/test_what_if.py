"""The rack page offers a what-if per rack and per tray; the answer page is the API's answer, and changes nothing.

A GB200 NVL72 rack and HGX boxes on one fabric, with replicas the reconciler
placed: one across two trays, one on an HGX box.
"""

from __future__ import annotations

import html
import re

import pytest
from django.apps import apps

from inventory.models import GPU, NVLinkDomain
from placement.models import Replica, Shard
from placement.writes.reconciler import reconcile
from tests.api.fleet import add_model, ingest_fleet

pytestmark = pytest.mark.django_db


@pytest.fixture
def fleet(db):
    ingest_fleet("gb200-nvl72:1@north,h100-hgx:2@north")
    gb200 = GPU.objects.filter(node__name__contains="tray").values_list("gpu_class", flat=True).first()
    add_model(
        {
            "name": "big",
            "scaling": {"min": 1, "max": 1},
            "profiles": [{"name": "nvl", "engine": "vllm", "gpu_class": gb200, "gpus": 4, "nodes": 2, "tp": 8}],
        }
    )
    add_model()  # llama-8b on one H100
    reconcile()
    return {r.model.name: r for r in Replica.objects.select_related("model")}


def links(page: str) -> dict[str, str]:
    """data-what-if → href of each what-if link on a page."""
    return {what: html.unescape(href) for href, what in re.findall(r'<a href="([^"]+)" data-what-if="([^"]+)"', page)}


def test_the_rack_page_offers_a_what_if_for_the_rack_and_each_tray(operator, fleet):
    offered = links(operator.get("/admin/nvlink/").content.decode())
    key = NVLinkDomain.objects.get().key
    assert offered["rack"] == f"/admin/nvlink/what-if/?lose={key.replace('/', '%2F')}"
    trays = {k for k in offered if k != "rack"}
    assert len(trays) == 18 and offered["nvl72-00-tray-03"] == "/admin/nvlink/what-if/?lose=nvl72-00-tray-03"
    domain_page = operator.get(f"/admin/nvlink/{NVLinkDomain.objects.get().pk}/").content.decode()
    assert links(domain_page) == offered


def test_losing_a_tray_keeps_the_replica_in_the_rack_and_says_so(operator, fleet):
    tray = Shard.objects.filter(replica=fleet["big"]).order_by("rank").first().node.name
    answer = operator.get("/admin/nvlink/what-if/", {"lose": tray})
    assert answer.status_code == 200
    page = answer.content.decode()
    assert f'data-replica="{fleet["big"].id}"' in page and 'data-over="nvlink"' in page
    assert "Losing 1 node would stop 1 replica; 1 would be placed elsewhere within 1 min" in page


def test_losing_the_rack_leaves_a_model_short_with_the_schedulers_reasons(operator, fleet):
    before = {m._meta.label: m.objects.count() for m in apps.get_models()}
    page = operator.get("/admin/nvlink/what-if/", {"lose": NVLinkDomain.objects.get().key}).content.decode()
    assert {m._meta.label: m.objects.count() for m in apps.get_models()} == before
    assert 'data-short="big"' in page and "big has nowhere to put it: see short" in page
    assert "(NVLink domain, 18 nodes)" in page and "no node has" in page


def test_a_target_that_names_nothing_is_a_400_with_the_sentence(operator, fleet):
    for path in ("/admin/nvlink/what-if/", "/admin/nvlink/what-if/live"):
        answer = operator.get(path, {"lose": "rack-9"})
        assert answer.status_code == 400
        assert "&#x27;rack-9&#x27; is not a node" in answer.content.decode()


def test_the_answer_is_live_and_asks_the_same_question_again(operator, fleet):
    page = operator.get("/admin/nvlink/what-if/", {"lose": ["hgx-000", "hgx-001"]}).content.decode()
    (url,) = re.findall(r'data-live-fragment="([^"]+)"', page)
    assert html.unescape(url) == "/admin/nvlink/what-if/live?lose=hgx-000&lose=hgx-001"
    fragment = operator.get(html.unescape(url)).content.decode()
    assert 'data-short="llama-8b"' in fragment and 'data-short="llama-8b"' in page
