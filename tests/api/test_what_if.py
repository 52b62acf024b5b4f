"""``GET /api/v1/what-if?lose=…``: the scheduler's answer for the fleet without some of it, and nothing changed.

A GB200 NVL72 rack and HGX boxes on one fabric, with replicas the reconciler
placed (one across two trays of the rack, one on an HGX box); every answer is
checked against the endpoint's own OpenAPI schema.
"""

from __future__ import annotations

import jsonschema
import pytest
from django.apps import apps
from django.db import connection
from django.test.utils import CaptureQueriesContext

from inventory.models import GPU, NVLinkDomain
from placement.models import Replica
from placement.writes.reconciler import reconcile
from tests.api.fleet import add_model, ingest_fleet

pytestmark = pytest.mark.django_db


@pytest.fixture
def fleet(db):
    ingest_fleet("gb200-nvl72:1@north,h100-hgx:3@north")
    gb200 = GPU.objects.filter(node__name__contains="tray").values_list("gpu_class", flat=True).first()
    add_model(
        {
            "name": "big",
            "scaling": {"min": 1, "max": 1},
            "profiles": [
                {"name": "nvl", "engine": "vllm", "gpu_class": gb200, "gpus": 4, "nodes": 2, "tp": 8},
                {"name": "ib", "engine": "vllm", "gpu_class": "h100-80g", "gpus": 8, "nodes": 2, "tp": 16},
            ],
        }
    )
    add_model()  # llama-8b: one H100
    reconcile()
    return {r.model.name: r for r in Replica.objects.select_related("model")}


def schema_of(client, component: str) -> dict:
    """The named component of the served OpenAPI schema, with the others it refers to."""
    raw = client.get("/api/v1/schema").json()
    return {"$ref": f"#/components/schemas/{component}", "components": raw["components"]}


def ask(client, *lose: str):
    return client.get("/api/v1/what-if", {"lose": list(lose)} if lose else {})


def test_losing_the_rack_says_where_its_replica_would_go(operator, fleet):
    domain = NVLinkDomain.objects.get()
    answer = ask(operator, domain.key)
    assert answer.status_code == 200, answer.content
    body = answer.json()
    jsonschema.validate(body, schema_of(operator, "WhatIf"))
    (stopped,) = body["stopped"]
    assert stopped["replica"] == fleet["big"].id and stopped["model"] == "big"
    assert stopped["to"]["interconnect"] == "infiniband" and stopped["to"]["profile"] == "ib"
    assert body["moves"] == {"count": 1, "per_minute": 20, "minutes": 1}
    assert "would stop 1 replica" in body["note"]


def test_a_model_left_short_comes_with_the_schedulers_reasons(operator, fleet):
    body = ask(operator, "hgx-000,hgx-001", "hgx-002").json()
    jsonschema.validate(body, schema_of(operator, "WhatIf"))
    assert [t["target"] for t in body["lose"]] == ["hgx-000", "hgx-001", "hgx-002"]
    (short,) = body["short"]
    assert short["model"] == "llama-8b" and short["after"] == 0 and "h100-80g" in short["reasons"][0]["reason"]
    (stopped,) = body["stopped"]
    assert "to" not in stopped and stopped["why"] == "llama-8b has nowhere to put it: see short"


def test_asking_changes_nothing(operator, fleet):
    before = {m._meta.label: m.objects.count() for m in apps.get_models()}
    with CaptureQueriesContext(connection) as queries:
        assert ask(operator, NVLinkDomain.objects.get().key, "hgx-000").status_code == 200
    assert {m._meta.label: m.objects.count() for m in apps.get_models()} == before
    # The one write is authentication's: the token's last use, which every API call records.
    writes = [q["sql"] for q in queries if q["sql"].split()[0].upper() in ("INSERT", "UPDATE", "DELETE")]
    assert [w for w in writes if not w.startswith('UPDATE "core_apitoken" SET "last_used_at"')] == []


def test_a_read_only_token_may_ask_and_nobody_may_not(reader, nobody, fleet):
    assert ask(reader, "hgx-000").status_code == 200
    assert ask(nobody, "hgx-000").status_code == 401


@pytest.mark.parametrize(
    ("lose", "says"),
    [
        ((), "say what to lose"),
        (("hgx-000", "rack-9"), "'rack-9' is not a node, an NVLink domain key, an InfiniBand fabric or LABEL=VALUE"),
        (("row=z",), "no node has the label row='z'"),
    ],
)
def test_an_unknown_target_is_a_400_that_names_it(operator, fleet, lose, says):
    answer = ask(operator, *lose)
    assert answer.status_code == 400 and says in answer.json()["error"]
    jsonschema.validate(answer.json(), schema_of(operator, "Error"))
