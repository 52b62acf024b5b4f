"""Every change made through the admin API is in the audit log with the account and token behind it.

Olivia's token makes each change; whoever she names in X-Llmgw-Actor, the row also says it was
her account and which of her tokens — whichever piece (the catalog, node states, the gateway's
tenancy views) wrote the row.
"""

from __future__ import annotations

import pytest

from core.models import AuditEntry, fit_audit_text
from gateway.models import Team
from tests.api.fleet import MODEL, add_model, ingest_fleet

pytestmark = pytest.mark.django_db

CPU_MODEL = {
    "name": "qwen-0.5b",
    "source": "https://example.org/qwen2.5-0.5b-instruct-q4_k_m.gguf",
    "scaling": {"min": 0, "max": 1},
    "profiles": [{"name": "cpu", "engine": "llamacpp", "gpu_class": "cpu", "memory_gb": 2, "gpus": 0}],
}

# Each write endpoint, with a body that succeeds on the fleet below.
WRITES = [
    ("post", "/api/v1/models", CPU_MODEL),
    ("post", f"/api/v1/models/{MODEL['name']}/scale", {"min": 2}),
    ("put", f"/api/v1/models/{MODEL['name']}/capacity", {"profile": "h100", "tokens_per_second": 1}),
    ("delete", f"/api/v1/models/{MODEL['name']}", None),
    ("post", "/api/v1/nodes/hgx-000/state", {"state": "cordon"}),
    ("post", "/api/v1/weights/collect", {}),
    ("post", "/api/v1/keys", {"team": "search"}),
    ("put", "/api/v1/budgets", {"scope": "team", "name": "search", "amount_micros": 5}),
]


@pytest.fixture
def fleet(db):
    ingest_fleet("h100-hgx:1@north")
    add_model()
    Team.objects.create(name="search", org_id=_org())


def _org() -> int:
    from gateway.models import Organisation

    return Organisation.objects.create(name="acme").pk


@pytest.mark.parametrize(("method", "path", "body"), WRITES)
def test_each_write_names_the_account_and_token_behind_it(operator, fleet, method, path, body):
    before = set(AuditEntry.objects.values_list("pk", flat=True))
    answer = getattr(operator, method)(path, body, format="json", HTTP_X_LLMGW_ACTOR="ana")
    assert answer.status_code < 300, answer.content
    written = AuditEntry.objects.exclude(pk__in=before)
    assert written.exists()
    for entry in written:
        assert entry.actor == "ana"
        assert entry.detail["user"] == "olivia" and entry.detail["via"] == "api", entry.action
        assert entry.detail["token"].startswith("llmgw_adm_"), entry.action


def test_rows_written_outside_a_request_name_no_token(fleet):
    entry = AuditEntry.record("the reconciler", "place", "llama-8b#1")
    assert "token" not in entry.detail


def test_any_writer_gets_its_names_fitted_to_the_columns(db):
    entry = AuditEntry.objects.create(actor="a\x00b " * 100, action="x" * 80, target="t\n" * 300)
    entry.refresh_from_db()
    assert entry.actor == fit_audit_text("a\x00b " * 100, 200) and len(entry.actor) == 200
    assert "\x00" not in entry.actor and len(entry.action) == 50 and "\n" not in entry.target


def test_every_app_writes_audit_rows_through_the_one_record_function():
    # One home for the audit rule (issue #19): a writer that builds rows itself can skip the
    # fitting in AuditEntry.save() (bulk_create does) or trim by a rule of its own.
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    writers = [
        str(p.relative_to(root))
        for app in ("inventory", "catalog", "placement", "gateway", "llmgw", "dashboard")
        for p in (root / app).rglob("*.py")
        if "migrations" not in p.parts
        and p != root / "llmgw" / "core" / "models.py"  # where record() itself is
        and re.search(r"AuditEntry\.objects\.(create|bulk_create)|AuditEntry\(", p.read_text())
    ]
    assert writers == []
