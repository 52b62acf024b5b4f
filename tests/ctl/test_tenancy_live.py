"""ctl keys, budgets and usage against the gateway's real endpoints, in-process."""

from __future__ import annotations

import json

import pytest

from core.models import ApiToken
from tests import people
from tests.ctl.transport import DjangoTransport, run

pytestmark = pytest.mark.django_db


@pytest.fixture
def ctl(db, monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    _, secret = ApiToken.issue(people.operator("olivia"), "laptop")
    monkeypatch.setenv("LLMGW_TOKEN", secret)
    transport = DjangoTransport()
    return lambda *argv: run(list(argv), transport)


def test_keys_budgets_and_usage_round_trip(ctl):
    code, out, err = ctl("keys", "create", "--team", "search", "--org", "acme", "--json")
    assert code == 0, err
    key = json.loads(out)
    assert key["key"] and key["team"] == "search"
    code, out, err = ctl("keys", "list")
    assert code == 0 and key["prefix"] in out, err
    code, out, err = ctl("budgets", "set", "team", "search", "100", "--period", "month")
    assert code == 0, err
    code, out, err = ctl("budgets", "list")
    assert code == 0 and "100.00" in out, err
    code, out, err = ctl("usage", "--by", "team")
    assert code == 0, err
    code, out, err = ctl("keys", "revoke", str(key["id"]))
    assert code == 0 and "revoked" in out, err
