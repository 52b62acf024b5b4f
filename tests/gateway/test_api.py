"""/api/v1/keys, /budgets and /usage: an operator who owns, one who only reads, and a stranger."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from core.models import ApiToken, AuditEntry
from gateway import reads as reports
from gateway.models import ApiKey, Budget, UsageHour, UsageRecord
from gateway.writes import keys
from tests import people

pytestmark = pytest.mark.django_db


def client_for(name: str, *, read_only: bool = False) -> APIClient:
    user = people.operator(name)
    _, secret = ApiToken.issue(user, f"{name}'s token", read_only=read_only)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


@pytest.fixture
def owner():
    return client_for("olivia")


@pytest.fixture
def reader():
    return client_for("rita", read_only=True)


def test_a_key_is_shown_once_then_listed_by_prefix(owner):
    made = owner.post("/api/v1/keys", {"team": "search", "org": "acme", "models": ["llama"]}, format="json")
    assert made.status_code == 201
    body = made.json()
    assert body["key"].startswith("sk-llmgw-") and body["prefix"] == body["key"][: keys.PREFIX_CHARS]
    assert (body["team"], body["org"], body["models"]) == ("search", "acme", ["llama"])
    listed = owner.get("/api/v1/keys").json()
    assert [k["id"] for k in listed] == [body["id"]] and "key" not in listed[0]
    assert listed[0]["revoked_at"] is None
    entry = AuditEntry.objects.get(action="key.create")
    assert entry.actor == "olivia" and body["key"] not in str(entry.detail)


def test_revoking_is_audited_with_the_actor_header(owner):
    made = owner.post("/api/v1/keys", {"team": "search"}, format="json").json()
    answer = owner.post(f"/api/v1/keys/{made['id']}/revoke", HTTP_X_LLMGW_ACTOR="ctl:olivia@laptop")
    assert answer.status_code == 200 and answer.json()["revoked_at"]
    assert keys.authenticate(made["key"])[0] is None
    assert AuditEntry.objects.get(action="key.revoke").actor == "ctl:olivia@laptop"
    assert owner.post("/api/v1/keys/nope/revoke").json() == {"error": "no key with id or prefix 'nope'"}


def test_bad_key_requests_say_what_to_fix(owner):
    assert owner.post("/api/v1/keys", {}, format="json").json()["error"].startswith("a key needs a team")
    bad_models = owner.post("/api/v1/keys", {"team": "t", "models": "llama"}, format="json")
    assert bad_models.status_code == 400 and "list of model names" in bad_models.json()["error"]
    owner.post("/api/v1/keys", {"team": "search", "org": "acme"}, format="json")
    conflict = owner.post("/api/v1/keys", {"team": "search", "org": "globex"}, format="json")
    assert conflict.status_code == 409 and "belongs to organisation 'acme'" in conflict.json()["error"]


def test_budgets_are_set_at_any_level_and_listed_with_their_spend(owner):
    made = owner.post("/api/v1/keys", {"team": "search", "org": "acme"}, format="json").json()
    for scope, name in (("org", "acme"), ("team", "search"), ("key", made["prefix"])):
        answer = owner.put(
            "/api/v1/budgets",
            {"scope": scope, "name": name, "amount_micros": 5_000_000, "period": "week"},
            format="json",
        )
        assert answer.status_code == 200, answer.json()
    Budget.objects.filter(scope="team").update(spent_micros=1234, period_start=timezone.now())
    again = owner.put("/api/v1/budgets", {"scope": "team", "name": "search", "amount_micros": 9}, format="json")
    assert again.json()["amount_micros"] == 9 and again.json()["period"] == "month"
    listed = {b["scope"]: b for b in owner.get("/api/v1/budgets").json()}
    assert listed["team"]["spent_micros"] == 1234 and listed["key"]["name"] == made["prefix"]
    assert Budget.objects.count() == 3 and AuditEntry.objects.filter(action="budget.set").count() == 4


@pytest.mark.parametrize(
    ("body", "status", "sentence"),
    [
        ({"scope": "galaxy", "name": "x", "amount_micros": 1}, 400, "scope must be org, team or key"),
        ({"scope": "team", "name": "nobody", "amount_micros": 1}, 404, "no team named 'nobody'"),
        ({"scope": "team", "name": "search", "amount_micros": -1}, 400, "whole number of micros"),
        ({"scope": "team", "name": "search", "amount_micros": 1, "period": "year"}, 400, "day, week or month"),
    ],
)
def test_bad_budgets_are_refused_with_a_sentence(owner, body, status, sentence):
    keys.issue(team="search")
    answer = owner.put("/api/v1/budgets", body, format="json")
    assert answer.status_code == status and sentence in answer.json()["error"]


def test_a_read_only_token_reads_but_changes_nothing(reader):
    assert reader.get("/api/v1/keys").status_code == 200
    assert reader.get("/api/v1/usage").status_code == 200
    refused = reader.post("/api/v1/keys", {"team": "search"}, format="json")
    assert refused.status_code == 403 and "read-only" in refused.json()["error"]
    assert not ApiKey.objects.exists()


def test_a_stranger_gets_nothing():
    assert APIClient().get("/api/v1/keys").status_code == 401
    assert APIClient().get("/api/v1/usage").status_code == 401


def record(key: ApiKey, at, *, prompt=10, completion=5, cost=7, status=200, hourly=True):
    UsageRecord.objects.create(
        at=at,
        key=key,
        team=key.team,
        org=key.team.org,
        requested="llama",
        model="llama",
        endpoint="chat/completions",
        prompt_tokens=prompt,
        completion_tokens=completion,
        cost_micros=cost,
        status=status,
        outcome="ok",
        latency_ms=1,
    )
    if hourly:
        hour, _ = UsageHour.objects.get_or_create(
            hour=at.replace(minute=0, second=0, microsecond=0), key=key, model="llama", defaults={"last_at": at}
        )
        UsageHour.objects.filter(pk=hour.pk).update(
            requests=hour.requests + 1,
            errors=hour.errors + (status >= 400),
            prompt_tokens=hour.prompt_tokens + prompt,
            completion_tokens=hour.completion_tokens + completion,
            cost_micros=hour.cost_micros + cost,
            last_at=at,
        )


def test_usage_rolls_up_by_key_team_and_organisation_within_the_window(owner):
    a = keys.issue(team="search", org="acme").key
    b = keys.issue(team="search", org="acme").key
    c = keys.issue(team="ads", org="acme").key
    now = timezone.now()
    record(a, now - timedelta(minutes=5))
    record(a, now - timedelta(hours=3), status=500)
    record(b, now - timedelta(minutes=1), prompt=1, completion=1, cost=1)
    record(c, now - timedelta(days=3))  # outside 24h
    Budget.objects.create(scope="team", team=a.team, amount_micros=100, period="day", spent_micros=25, period_start=now)

    teams = {u["name"]: u for u in owner.get("/api/v1/usage?by=team&since=24h").json()}
    search = teams["search"]
    assert (search["requests"], search["errors"], search["prompt_tokens"], search["cost_micros"]) == (3, 1, 21, 15)
    assert search["keys"] == 2 and search["budget_micros"] == 100 and search["fraction"] == 0.25
    assert teams["ads"]["requests"] == 0 and "budget_micros" not in teams["ads"]
    orgs = owner.get("/api/v1/usage?by=org&since=7d").json()
    assert [(o["name"], o["requests"], o["keys"]) for o in orgs] == [("acme", 4, 3)]
    by_key = {u["id"]: u for u in owner.get("/api/v1/usage?by=key&since=2h").json()}
    assert by_key[a.id]["requests"] == 1 and by_key[b.id]["requests"] == 1 and by_key[c.id]["requests"] == 0


def test_the_part_hour_at_the_start_of_the_window_is_read_from_the_records():
    key = keys.issue(team="search").key
    now = datetime(2026, 3, 18, 12, 30, tzinfo=UTC)
    # 11:40 is inside the window's first part-hour (11:30 to 12:00): only its raw record counts.
    record(key, now - timedelta(minutes=50), hourly=False)
    record(key, now - timedelta(minutes=70))  # 11:20: before the window, though its hour overlaps it
    record(key, now - timedelta(minutes=10))  # 12:20: a whole hour of the window, read from the roll-up
    rows = reports.usage_by_scope("key", timedelta(hours=1), now=now)
    assert rows[0]["requests"] == 2


def test_usage_refuses_what_it_cannot_read(owner):
    assert "by must be org, team or key" in owner.get("/api/v1/usage?by=planet").json()["error"]
    assert "like 24h" in owner.get("/api/v1/usage?since=yesterday").json()["error"]
