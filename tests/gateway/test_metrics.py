"""The gateway's figures on /metrics, from what usage recorded."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from core.models import ApiToken
from gateway import metrics as gateway_metrics
from gateway.models import ApiKey, Budget, Organisation, Team, UsageHour, UsageRecord
from observability import metrics
from tests import people

pytestmark = pytest.mark.django_db


@pytest.fixture
def key():
    org = Organisation.objects.create(name="acme")
    team = Team.objects.create(name="search", org=org)
    return ApiKey.objects.create(team=team, name="k", prefix="llmgw_abc", digest="d" * 64)


def scrape(client, django_user_model) -> dict:
    user = people.person("prom", "viewers")
    _, token = ApiToken.issue(user, "prometheus", read_only=True)
    text = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {token}").content.decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def test_requests_tokens_and_latency_reach_the_scrape(client, django_user_model, key):
    now = timezone.now()
    UsageHour.objects.create(
        hour=now.replace(minute=0, second=0, microsecond=0),
        key=key,
        model="llama-8b",
        requests=10,
        errors=2,
        prompt_tokens=300,
        completion_tokens=700,
        cost_micros=55,
        last_at=now,
    )
    for ms in (10, 20, 30, 40, 400):
        UsageRecord.objects.create(
            key=key,
            team=key.team,
            org=key.team.org,
            requested="llama-8b",
            model="llama-8b",
            endpoint="chat",
            stream=True,
            status=200,
            outcome="ok",
            latency_ms=ms,
            ttfb_ms=ms / 10,
            prompt_tokens=1,
            completion_tokens=1,
        )
    samples = scrape(client, django_user_model)
    assert samples[("llmgw_gateway_requests_total", (("model", "llama-8b"), ("result", "ok")))] == 8
    assert samples[("llmgw_gateway_requests_total", (("model", "llama-8b"), ("result", "error")))] == 2
    assert samples[("llmgw_gateway_tokens_total", (("kind", "completion"), ("model", "llama-8b")))] == 700
    p99 = samples[("llmgw_gateway_latency_seconds", (("model", "llama-8b"), ("quantile", "0.99"), ("stream", "true")))]
    assert p99 == pytest.approx(0.4)
    assert samples[("llmgw_gateway_first_byte_seconds", (("model", "llama-8b"), ("quantile", "0.5")))] == pytest.approx(
        0.003
    )


def test_observability_names_the_gateways_source_and_the_gateway_never_imports_observability():
    """Higher imports lower: the scrape reads gateway.metrics; the gateway is not told to register from below."""
    assert metrics.SOURCES["gateway"] is gateway_metrics.collect
    for path in Path(gateway_metrics.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            names += [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            assert not [n for n in names if n.split(".")[0] == "observability"], f"{path.name} imports observability"


def test_each_budget_says_how_much_of_it_is_used(client, django_user_model, key):
    """Spent plus reserved over the amount, per budget, for an alert on a budget near its end."""
    Budget.objects.create(scope="team", team=key.team, amount_micros=1000, spent_micros=850, reserved_micros=50)
    Budget.objects.create(scope="org", org=key.team.org, amount_micros=4000, spent_micros=1000)
    samples = scrape(client, django_user_model)
    assert samples[("llmgw_gateway_budget_used_ratio", (("name", "search"), ("scope", "team")))] == pytest.approx(0.9)
    assert samples[("llmgw_gateway_budget_used_ratio", (("name", "acme"), ("scope", "org")))] == pytest.approx(0.25)
