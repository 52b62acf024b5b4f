"""A reconcile is a trace of its own: one span for the pass, its plan and its writes as children."""

from __future__ import annotations

import pytest

from core import tracing
from inventory.models import GPU
from placement.writes.reconciler import reconcile
from tests.otlp import exporters_made, otel_env, receiver  # noqa: F401 (fixtures)
from tests.placement.dbfleet import fleet, gpu_profile, live, model

pytestmark = pytest.mark.django_db


def one_model_to_place() -> None:
    fleet("h100-hgx:1")
    model("small", gpu_profile(GPU.objects.values_list("gpu_class", flat=True).first()))


def test_a_reconcile_sends_a_span_with_what_it_did(otel_env, receiver):  # noqa: F811
    one_model_to_place()
    otel_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
    assert tracing.setup("llmgw-worker")

    reconcile()
    tracing.flush()

    assert len(live("small")) == 1
    spans = receiver.wait_for("placement.reconcile", "placement.reconcile.plan", "placement.reconcile.writes")
    whole = spans["placement.reconcile"]
    assert whole.attributes["llmgw.created"] == 1 and whole.attributes["llmgw.stopped"] == 0
    assert whole.service == "llmgw-worker" and whole.parent_span_id == ""
    for step in ("placement.reconcile.plan", "placement.reconcile.writes"):
        assert spans[step].parent_span_id == whole.span_id and spans[step].trace_id == whole.trace_id


def test_with_no_endpoint_a_reconcile_sends_nothing(otel_env, receiver, exporters_made):  # noqa: F811
    one_model_to_place()
    assert not tracing.setup("llmgw-worker")
    reconcile()
    tracing.flush()
    assert len(live("small")) == 1
    assert exporters_made == [] and receiver.posts == 0
