"""Who may call what: nobody gets nothing, a read-only token may only read, an operator may change things."""

from __future__ import annotations

import pytest

from core.models import ApiToken
from tests.api.fleet import add_model, ingest_fleet

pytestmark = pytest.mark.django_db

READS = [
    "/api/v1/summary",
    "/api/v1/nodes",
    "/api/v1/nodes/hgx-000",
    "/api/v1/nodes/hgx-000/logs",
    "/api/v1/models",
    "/api/v1/replicas",
    "/api/v1/explain-placement?model=llama-8b",
    "/api/v1/what-if?lose=hgx-000",
    "/api/v1/nvlink",
    "/api/v1/fabrics",
    "/api/v1/capacity",
    "/api/v1/weights/orphans",
    "/api/v1/schema",
]
WRITES = [
    ("post", "/api/v1/nodes/hgx-000/state", {"state": "cordon"}),
    ("post", "/api/v1/models", {"name": "x"}),
    ("delete", "/api/v1/models/llama-8b", None),
    ("post", "/api/v1/models/llama-8b/scale", {"min": 2}),
    ("put", "/api/v1/models/llama-8b/capacity", {"profile": "h100", "tokens_per_second": 1}),
    ("post", "/api/v1/weights/collect", {}),
]


@pytest.fixture
def fleet(db):
    ingest_fleet("h100-hgx:1@north")
    add_model()


@pytest.mark.parametrize("path", READS)
def test_nobody_reads_nothing(nobody, fleet, path):
    answer = nobody.get(path)
    assert answer.status_code == 401
    assert "credentials were not provided" in answer.json()["error"]
    assert answer["WWW-Authenticate"].startswith("Bearer")


@pytest.mark.parametrize(("method", "path", "body"), WRITES)
def test_nobody_changes_nothing(nobody, fleet, method, path, body):
    assert getattr(nobody, method)(path, body, format="json").status_code == 401


@pytest.mark.parametrize("path", READS)
def test_a_read_only_token_reads_everything(reader, fleet, path):
    answer = reader.get(path)
    assert answer.status_code == 200, answer.content


@pytest.mark.parametrize(("method", "path", "body"), WRITES)
def test_a_read_only_token_changes_nothing(reader, fleet, method, path, body):
    answer = getattr(reader, method)(path, body, format="json")
    assert answer.status_code == 403
    assert "read-only" in answer.json()["error"] and "operator" in answer.json()["error"]


def test_a_revoked_token_is_refused(operator, fleet):
    from django.utils import timezone

    ApiToken.objects.update(revoked_at=timezone.now())
    answer = operator.get("/api/v1/summary")
    assert answer.status_code == 401 and "revoked" in answer.json()["error"]


def test_healthz_needs_no_token(nobody):
    assert nobody.get("/healthz").status_code == 200


def test_an_unknown_path_is_a_json_404_for_a_caller_with_a_token(operator, nobody):
    answer = operator.get("/api/v1/nodez")
    assert answer.status_code == 404 and "/api/v1/schema" in answer.json()["error"]
    assert nobody.get("/api/v1/nodez").status_code == 401


def test_a_method_the_endpoint_lacks_is_a_405_sentence(operator, fleet):
    answer = operator.delete("/api/v1/summary")
    assert answer.status_code == 405 and "DELETE" in answer.json()["error"]
