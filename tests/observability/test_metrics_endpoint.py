"""``/metrics`` on the admin listener: who may scrape it, and what the answer holds.

Personas: an operator with their API token, a Prometheus server holding a
read-only token, a token that was revoked, the token of a disabled account,
and a stranger with nothing or something made up.
"""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from core.models import ApiToken
from tests import people
from tests.observability.fleet import Scrape, ingest_fleet

pytestmark = pytest.mark.django_db


@pytest.fixture
def operator_token() -> str:
    user = people.operator("olivia", password="x")
    return ApiToken.issue(user, "ctl on my laptop")[1]


@pytest.fixture
def scraper_token() -> str:
    user = people.person("prometheus", "viewers", password="x")
    return ApiToken.issue(user, "prometheus", read_only=True)[1]


def get(client, header: str | None):
    return client.get("/metrics", **({"HTTP_AUTHORIZATION": header} if header is not None else {}))


@pytest.mark.parametrize(
    "header",
    [None, "", "Bearer", "Bearer ", "Basic b2xpdmlhOng=", "Token llmgw_adm_x", "Bearer llmgw_adm_made_up"],
)
def test_a_stranger_gets_401(client, header):
    answer = get(client, header)
    assert answer.status_code == 401
    assert answer["WWW-Authenticate"] == 'Bearer realm="llmgw"'
    assert b"llmgw_gpus" not in answer.content


def test_a_revoked_token_gets_401(client, scraper_token):
    ApiToken.objects.update(revoked_at=timezone.now())
    answer = get(client, f"Bearer {scraper_token}")
    assert answer.status_code == 401 and b"revoked" in answer.content


def test_a_disabled_accounts_token_gets_401(client, scraper_token):
    get_user_model().objects.filter(username="prometheus").update(is_active=False)
    answer = get(client, f"Bearer {scraper_token}")
    assert answer.status_code == 401 and b"disabled" in answer.content


def test_a_logged_in_session_is_not_enough(client, operator_token):
    """A scraper sends a token; a browser's session cookie is not one."""
    client.login(username="olivia", password="x")
    assert get(client, None).status_code == 401


@pytest.mark.parametrize("persona", ["operator_token", "scraper_token"])
def test_an_operator_or_a_read_only_scraper_gets_the_figures(client, persona, request):
    ingest_fleet("gb200-nvl72:1,h100-hgx:1", timezone.now())
    answer = get(client, f"Bearer {request.getfixturevalue(persona)}")
    assert answer.status_code == 200
    assert answer["Content-Type"].startswith("text/plain; version=0.0.4")
    scrape = Scrape(answer.content.decode())
    # the fleet...
    assert len(scrape.samples("llmgw_gpu_nvlink_joined")) == 72
    assert scrape.value("llmgw_gpus", **{"class": "h100-80g", "state": "free"}) == 8
    # ...and this process's own figures, from django-prometheus's registry
    assert "django_http_requests_before_middlewares" in scrape.families
    assert "django_db_execute" in scrape.families, "queries are counted through the instrumented backend"


def test_metrics_changes_nothing_and_refuses_other_methods(client, scraper_token):
    assert client.post("/metrics", HTTP_AUTHORIZATION=f"Bearer {scraper_token}").status_code == 405
