"""deploy/prometheus and deploy/grafana: Prometheus's own checks, and every metric they name is really scraped.

The scrape is a live GET /metrics (a read-only token, as Prometheus holds)
of a fleet built here through the real ingestion path, with a model, its
replicas, a finding, a reconcile timed, a budget and gateway usage, so every
family llmgw exports has samples.
"""

from __future__ import annotations

import json
import re
import subprocess
from datetime import timedelta

import pytest
import yaml
from django.utils import timezone

from catalog.models import CatalogModel, Profile
from core.models import ApiToken, Finding
from gateway.models import ApiKey, Budget, Organisation, Team, UsageHour, UsageRecord
from observability.metrics import observe_reconcile
from placement.models import Replica
from tests import people
from tests.deploy.tools import DEPLOY, ROOT, ensure
from tests.observability.fleet import Scrape, ingest_fleet

RULES = DEPLOY / "prometheus" / "llmgw-rules.yml"
RULES_TEST = ROOT / "tests" / "deploy" / "llmgw-rules.test.yml"
DASHBOARD = DEPLOY / "grafana" / "llmgw.json"
METRIC = re.compile(r"\b((?:llmgw|django|process|python)_[a-z0-9_]+)\b")
MADE_BY_PROMETHEUS = {"up"}
"""Series Prometheus makes itself for each target; never in a scrape."""
ALERTS = {
    "nodes unreachable": "LlmgwNodeUnreachable",
    "cards out of their NVLink domain": "LlmgwCardOutOfNVLinkDomain",
    "IMEX down": "LlmgwIMEXDown",
    "models short": "LlmgwModelShort",
    "models parked": "LlmgwModelParked",
    "budgets near their end": "LlmgwBudgetNearItsEnd",
    "gateway errors": "LlmgwGatewayErrors",
    "usage writes failing": "LlmgwUsageWritesFailing",
}


def rule_exprs() -> dict[str, str]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return {rule["alert"]: rule["expr"] for group in groups for rule in group["rules"]}


def dashboard_exprs() -> dict[str, list[str]]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return {p["title"]: [t["expr"] for t in p.get("targets", [])] for p in panels if p["type"] != "row"}


def named_metrics(exprs) -> set[str]:
    return {m for expr in exprs for m in METRIC.findall(expr)}


@pytest.fixture
def live_scrape(client, django_user_model) -> Scrape:
    now = timezone.now()
    ingest_fleet("gb200-nvl72:1,h100-hgx:1,cpu:1", now)
    llama = CatalogModel.objects.create(name="llama", min_replicas=2, max_replicas=2)
    Profile.objects.create(model=llama, name="hgx", engine="vllm", gpu_class="h100-80g")
    Replica.objects.create(model=llama, profile_name="hgx", state="ready")
    Finding.objects.create(kind="node_silent", subject="cpu-00", message="m", severity="critical")
    observe_reconcile(0.25)
    team = Team.objects.create(name="search", org=Organisation.objects.create(name="acme"))
    key = ApiKey.objects.create(team=team, name="k", prefix="sk-llmgw-abc", digest="d" * 64)
    Budget.objects.create(scope="team", team=team, amount_micros=1000, spent_micros=950)
    hour = now.replace(minute=0, second=0, microsecond=0)
    UsageHour.objects.create(
        hour=hour, key=key, model="llama", requests=3, errors=1, prompt_tokens=9, completion_tokens=9, last_at=now
    )
    UsageRecord.objects.create(
        key=key,
        team=team,
        org=team.org,
        requested="llama",
        model="llama",
        endpoint="chat",
        stream=True,
        status=200,
        outcome="ok",
        latency_ms=40,
        ttfb_ms=4,
        at=now - timedelta(seconds=5),
    )
    user = people.person("prometheus", "viewers")
    _, token = ApiToken.issue(user, "prometheus", read_only=True)
    client.get("/healthz")  # a request of the admin listener's own, so its request counters have samples
    answer = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert answer.status_code == 200
    return Scrape(answer.content.decode())


def scraped_names(scrape: Scrape) -> set[str]:
    return {s.name for family in scrape.families.values() for s in family.samples}


@pytest.mark.django_db
def test_every_metric_the_rules_and_the_dashboard_name_is_in_a_live_scrape(live_scrape):
    scraped = scraped_names(live_scrape)
    named = named_metrics(rule_exprs().values()) | named_metrics(e for es in dashboard_exprs().values() for e in es)
    assert {n for n in named if n.startswith("llmgw_gateway_")}, "the gateway's figures are named too"
    missing = sorted(named - scraped - MADE_BY_PROMETHEUS)
    assert not missing, f"named but not in the scrape: {missing}"


@pytest.mark.django_db
def test_a_misspelt_metric_would_be_caught(live_scrape):
    assert "llmgw_node_upp" not in scraped_names(live_scrape)
    assert named_metrics(["max(llmgw_node_upp) by (node)"]) == {"llmgw_node_upp"}


def test_the_rules_alert_on_what_the_issue_lists():
    exprs = rule_exprs()
    for what, alert in ALERTS.items():
        assert alert in exprs, f"no alert for {what}"


def test_promtool_accepts_the_rules():
    promtool = ensure("promtool", "prometheus")
    done = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_promtool_refuses_a_broken_rule(tmp_path):
    promtool = ensure("promtool", "prometheus")
    broken = tmp_path / "rules.yml"
    broken.write_text(
        RULES.read_text().replace("max by (node) (llmgw_imex_up) == 0", "max by (node) (llmgw_imex_up ===")
    )
    done = subprocess.run([promtool, "check", "rules", str(broken)], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0


def test_promtool_unit_tests_fire_the_alerts_when_they_should(tmp_path):
    """tests/deploy/llmgw-rules.test.yml: series in, alerts out (promtool test rules)."""
    promtool = ensure("promtool", "prometheus")
    test = tmp_path / "rules.test.yml"
    test.write_text(RULES_TEST.read_text().replace("RULES_FILE", str(RULES)))
    done = subprocess.run([promtool, "test", "rules", str(test)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_dashboard_covers_the_fleet_the_gateway_and_the_reconciler():
    board = json.loads(DASHBOARD.read_text())
    rows = [p["title"] for p in board["panels"] if p["type"] == "row"]
    assert {"Fleet", "Gateway", "Placement and the reconciler"} <= set(rows)
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids)), "panel ids are unique"
    for panel in board["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["targets"] and all(t["datasource"]["uid"] == "${datasource}" for t in panel["targets"])
    assert [v["name"] for v in board["templating"]["list"]] == ["datasource"]
