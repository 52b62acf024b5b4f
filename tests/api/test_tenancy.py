"""/api/v1/keys, /budgets and /usage go through the admin API's one base, like every other write view.

Olivia operates (her token may change things); every bad body is her mistake, answered with a
4xx sentence that names the field, and nothing is stored — least of all a key whose secret
was never shown to her.
"""

from __future__ import annotations

import pytest

from api.base import ACTOR_MAX, JSON_BODY_LIMIT
from core.models import AuditEntry
from gateway.models import ApiKey, Budget, Organisation, Team
from gateway.writes import keys
from gateway.writes.budgets import MAX_MICROS

pytestmark = pytest.mark.django_db

BIGINT_MAX = 2**63 - 1


def post_key(client, body, **headers):
    return client.post("/api/v1/keys", body, format="json", **headers)


def nothing_stored() -> bool:
    return not (ApiKey.objects.exists() or Team.objects.exists() or Organisation.objects.exists())


def test_a_deeply_nested_body_is_a_sentence_not_a_traceback(operator):
    deep = b"[" * 5000 + b"]" * 5000
    answer = operator.post("/api/v1/keys", deep, content_type="application/json")
    assert answer.status_code == 400 and "nested deeper than 64 levels" in answer.json()["error"]
    assert nothing_stored()


def test_a_body_past_one_mebibyte_is_refused_unread(operator):
    big = b'{"team": "' + b"x" * JSON_BODY_LIMIT + b'"}'
    answer = operator.post("/api/v1/keys", big, content_type="application/json")
    assert answer.status_code == 413 and "1 MiB" in answer.json()["error"]
    assert nothing_stored()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"team": "t" * 101}, "team"),
        ({"team": "search", "org": "o" * 101}, "org"),
        ({"team": "search", "name": "n" * 101}, "name"),
        ({"team": "search", "models": ["m" * 129]}, "models[0]"),
        ({"team": "search", "models": ["llama", 7]}, "models[1]"),
        ({"team": 7}, "team"),
        ({"team": "search", "rpm": 5}, "rpm"),
    ],
)
def test_a_key_field_the_store_cannot_hold_is_refused_by_name(operator, body, field):
    answer = post_key(operator, body)
    assert answer.status_code == 400, answer.content
    assert answer.json()["error"].startswith(f"{field} "), answer.json()
    assert nothing_stored()


def test_a_nul_in_a_name_is_refused(operator):
    answer = post_key(operator, {"team": "sea\x00rch"})
    assert answer.status_code == 400 and "NUL" in answer.json()["error"]
    assert nothing_stored()


def test_a_long_actor_header_is_trimmed_by_the_audit_rule_and_the_key_is_answered(operator):
    answer = post_key(operator, {"team": "search"}, HTTP_X_LLMGW_ACTOR="ana " + "x" * 5000)
    assert answer.status_code == 201 and answer.json()["key"].startswith("sk-llmgw-")
    entry = AuditEntry.objects.get(action="key.create")
    assert entry.actor == ("ana " + "x" * 5000)[:ACTOR_MAX]


def test_an_actor_header_with_a_nul_is_refused_before_anything_is_written(operator):
    answer = post_key(operator, {"team": "search"}, HTTP_X_LLMGW_ACTOR="ana\x00")
    assert answer.status_code == 400 and "X-Llmgw-Actor" in answer.json()["error"]
    assert nothing_stored() and not AuditEntry.objects.exists()


def test_a_key_whose_audit_row_fails_is_not_kept(operator, monkeypatch):
    """The key and its audit row are one transaction: a key nobody was shown must not exist."""

    def broken(*args, **kwargs):
        raise RuntimeError("the audit log is unwritable")

    monkeypatch.setattr(AuditEntry.objects, "create", broken)
    with pytest.raises(RuntimeError):
        post_key(operator, {"team": "search"})
    assert nothing_stored()


def test_audit_rows_name_the_token_and_its_owner(operator):
    made = post_key(operator, {"team": "search"}, HTTP_X_LLMGW_ACTOR="ana").json()
    operator.post(f"/api/v1/keys/{made['id']}/revoke")
    operator.put("/api/v1/budgets", {"scope": "team", "name": "search", "amount_micros": 5}, format="json")
    for action in ("key.create", "key.revoke", "budget.set"):
        entry = AuditEntry.objects.get(action=action)
        assert entry.detail["user"] == "olivia" and entry.detail["via"] == "api", action
        assert entry.detail["token"].startswith("llmgw_adm_"), action
    assert AuditEntry.objects.get(action="key.create").actor == "ana"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"scope": "team", "name": "search", "amount_micros": BIGINT_MAX + 1}, "amount_micros"),
        ({"scope": "team", "name": "search", "amount_micros": 2**61 + 1}, "amount_micros"),
        ({"scope": "team", "name": "search", "amount_micros": 10**400}, "amount_micros"),
        ({"scope": "team", "name": "search", "amount_micros": 1.5}, "amount_micros"),
        ({"scope": "team", "name": "search", "amount_micros": True}, "amount_micros"),
        ({"scope": "team", "name": "s" * 101, "amount_micros": 1}, "name"),
        ({"scope": "team", "name": ["search"], "amount_micros": 1}, "name"),
        ({"scope": ["team"], "name": "search", "amount_micros": 1}, "scope"),
        ({"scope": "team", "name": "search", "amount_micros": 1, "period": {}}, "period"),
        ({"scope": "team", "name": "search", "amount_micros": 1, "spent_micros": 0}, "spent_micros"),
    ],
)
def test_a_budget_field_out_of_its_columns_range_is_refused_by_name(operator, body, field):
    keys.issue(team="search")
    answer = operator.put("/api/v1/budgets", body, format="json")
    assert answer.status_code == 400, answer.content
    assert answer.json()["error"].startswith(f"{field} "), answer.json()
    assert not Budget.objects.exists()


def test_the_largest_budget_admission_can_add_to_is_stored(operator):
    # Not the column's own limit: admission adds spent, reserved and an estimate in SQL, and
    # each is kept below budgets.MAX_MICROS so that sum never overflows a bigint.
    keys.issue(team="search")
    answer = operator.put(
        "/api/v1/budgets", {"scope": "team", "name": "search", "amount_micros": MAX_MICROS}, format="json"
    )
    assert answer.status_code == 200 and Budget.objects.get().amount_micros == MAX_MICROS


@pytest.mark.parametrize("since", ["99999999999999d", "9" * 400 + "h"])
def test_a_usage_window_past_any_calendar_is_refused(operator, since):
    answer = operator.get("/api/v1/usage", {"since": since})
    assert answer.status_code == 400 and "since" in answer.json()["error"]


def test_a_nul_in_a_key_id_is_refused(operator):
    answer = operator.post("/api/v1/keys/ab%00cd/revoke")
    assert answer.status_code == 400 and "NUL" in answer.json()["error"]
