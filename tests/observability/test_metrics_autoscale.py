"""``/metrics`` exports each model's desired against running replicas, and the load the autoscaler reads."""

from __future__ import annotations

import pytest
from django.utils import timezone

from catalog import writes as service
from placement.models import Autoscale
from placement.writes import load
from tests.observability.fleet import scrape_fleet

pytestmark = pytest.mark.django_db

PROFILE = {"name": "cpu", "engine": "llamacpp", "gpu_class": "cpu", "memory_gb": 4}


def test_desired_running_and_the_load_signals(settings):
    settings.LLMGW_REDIS_URL = None
    service.add_model({"name": "m", "scaling": {"min": 1, "max": 4}, "profiles": [PROFILE]}, actor="test")
    service.add_model({"name": "quiet", "scaling": {"min": 2, "max": 2}, "profiles": [PROFILE]}, actor="test")
    now = timezone.now()
    Autoscale.objects.create(
        model=service.resolve("m"), desired=3, direction="up", reason="r", decided_at=now, load_source="database"
    )
    load.store("gw-1", {"m": {"in_flight": 5, "waiting": 1, "tokens_per_s": 40.0, "ttft_ms": 250.0}}, now)
    load.store("gw-2", {"m": {"in_flight": 2, "waiting": 0, "tokens_per_s": 10.0, "ttft_ms": 150.0}}, now)
    scrape = scrape_fleet(now)
    assert scrape.by("llmgw_model_replicas_desired", "model") == {("m",): 3.0, ("quiet",): 2.0}
    assert scrape.by("llmgw_model_replicas_running", "model") == {("m",): 0.0, ("quiet",): 0.0}
    assert scrape.value("llmgw_model_requests_in_flight", model="m") == 7.0
    assert scrape.value("llmgw_model_requests_waiting", model="m") == 1.0
    assert scrape.value("llmgw_model_tokens_per_second", model="m") == 50.0
    assert scrape.value("llmgw_model_time_to_first_token_seconds", model="m") == pytest.approx(0.2)
    assert scrape.value("llmgw_model_requests_in_flight", model="quiet") == 0.0
