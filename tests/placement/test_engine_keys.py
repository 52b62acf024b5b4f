"""Each replica's engine key: its own, sent to the nodes that run it, and shown nowhere else."""

from __future__ import annotations

import importlib

import pytest
from django.apps import apps
from django.contrib.auth import get_user_model
from django.test import Client
from rest_framework.test import APIClient

from core.models import ApiToken
from inventory.models import Node
from placement import assignments
from placement.models import Replica
from tests.api.fleet import add_model, ingest_fleet, place

pytestmark = pytest.mark.django_db


@pytest.fixture
def two(db):
    ingest_fleet("h100-hgx:2@north")
    model = add_model()
    return place(model, "hgx-000", [0]), place(model, "hgx-001", [0])


def node_pk(name: str) -> int:
    return Node.objects.get(name=name).pk


def test_every_replica_has_its_own_key_and_only_its_nodes_are_told_it(two):
    a, b = two
    assert a.engine_key != b.engine_key and len(a.engine_key) >= 43
    [shard] = assignments.for_node(node_pk("hgx-000"))
    assert shard["replica"] == a.id and shard["api_key"] == a.engine_key
    assert b.engine_key not in repr(assignments.for_node(node_pk("hgx-000")))


def test_no_listing_or_page_shows_the_key(two):
    a, b = two
    user = get_user_model().objects.create_superuser("olivia", password="x")
    _, token = ApiToken.issue(user, "ctl")
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    pages = [api.get(p) for p in ("/api/v1/replicas", "/api/v1/models", "/api/v1/nodes/hgx-000", "/api/v1/summary")]
    admin = Client()
    admin.force_login(user)
    pages += [admin.get(f"/admin/placement/replica/{a.id}/change/"), admin.get("/admin/placement/replica/")]
    for page in pages:
        assert page.status_code == 200, page
        assert a.engine_key not in page.content.decode() and b.engine_key not in page.content.decode()


def test_replicas_placed_before_keys_existed_each_get_their_own():
    ingest_fleet("h100-hgx:2@north")
    model = add_model()
    place(model, "hgx-000", [0]), place(model, "hgx-001", [0])
    Replica.objects.update(engine_key="")
    migration = importlib.import_module("placement.migrations.0004_replica_engine_key")
    migration.fill_keys(apps, None)
    keys = list(Replica.objects.values_list("engine_key", flat=True))
    assert len(set(keys)) == 2 and all(len(k) >= 43 for k in keys)
