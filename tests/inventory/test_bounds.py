"""The report's column limits come from the models, and cover every bounded column ingest writes."""

from __future__ import annotations

import pytest
from django.db import models

from core.columns import field_limit
from inventory.bounds import REPORT_COLUMNS, report_bounds
from inventory.models import GPU, IBPort, Node
from inventory.writes import ingest

# Written by ingest, but cut to fit there rather than refused: a reason in words, not an identity.
CUT_TO_FIT = {(IBPort, "sm_error")}


@pytest.mark.parametrize(
    ("model", "columns"),
    [(Node, ingest.node_columns({})), (GPU, ingest.gpu_columns({})), (IBPort, ingest.port_columns({}))],
)
def test_every_bounded_column_ingest_writes_has_a_limit_in_the_schema(model, columns):
    covered = {pair for pairs in REPORT_COLUMNS.values() for pair in pairs}
    for name in columns:
        field = model._meta.get_field(name)
        if isinstance(field, models.CharField | models.IntegerField) and (model, name) not in CUT_TO_FIT:
            assert (model, name) in covered, f"{model.__name__}.{name} is written from a report with no limit"


def test_the_limits_are_the_columns_own():
    bounds = report_bounds()
    assert bounds["agent_version"] == Node._meta.get_field("agent_version").max_length
    assert bounds["ib_ports[].port"] == (0, 32767), "PositiveSmallIntegerField"
    assert bounds["gpus[].index"] == (0, 2**31 - 1)
    assert bounds["gpus[].memory_mb"] == (-(2**63), 2**63 - 1)
    # A value written to two columns gets the narrower of them.
    assert bounds["ib_ports[].sm_guid"] == 32


def test_a_narrower_column_narrows_the_schema(monkeypatch):
    field = GPU._meta.get_field("uuid")
    monkeypatch.setattr(field, "max_length", 12)
    assert field_limit(GPU, "uuid") == 12
