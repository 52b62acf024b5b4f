"""ctl keys, budgets and usage against a fake of the gateway piece's endpoints (the contract's shapes)."""

from __future__ import annotations

import json

import httpx
import pytest

from llmgw.ctl.config import ConfigError, resolve
from llmgw.ctl.tenancy import amount_micros
from tests.ctl.transport import body, fake_gateway, run

KEY = {
    "id": 7,
    "key": "llmgw_sk_secret",
    "prefix": "llmgw_sk_se",
    "team": "search",
    "org": "acme",
    "models": ["a", "b"],
}


def test_keys_create_prints_the_key_once_and_sends_what_was_asked():
    sent = []

    def create(request):
        sent.append(body(request))
        return 201, KEY

    transport = fake_gateway({("POST", "/api/v1/keys"): create})
    code, out, _ = run(["keys", "create", "--team", "search", "--org", "acme", "--models", "a, b"], transport)
    assert code == 0 and out.splitlines()[0] == "llmgw_sk_secret"
    assert sent == [{"team": "search", "org": "acme", "models": ["a", "b"]}]
    code, out, _ = run(["keys", "create", "--team", "search", "--json"], transport)
    assert json.loads(out)["key"] == "llmgw_sk_secret" and sent[-1] == {"team": "search"}


def test_keys_list_and_revoke():
    listed = [{**KEY, "created_at": "2026-10-05T10:00:00Z", "revoked_at": None}, {**KEY, "id": 8, "models": None}]
    transport = fake_gateway(
        {
            ("GET", "/api/v1/keys"): lambda r: (200, listed),
            ("POST", "/api/v1/keys/7/revoke"): lambda r: (200, {"id": 7, "revoked_at": "2026-10-05T11:00:00Z"}),
        }
    )
    code, out, _ = run(["keys", "list"], transport)
    assert code == 0 and "search" in out and "a, b" in out and "all" in out
    code, out, _ = run(["keys", "revoke", "7"], transport)
    assert code == 0 and "revoked 7" in out


def test_budgets_set_converts_currency_to_micros_and_lists():
    sent = []

    def put(request):
        sent.append(body(request))
        return 200, {**sent[-1], "spent_micros": 0}

    listed = [
        {"scope": "team", "name": "search", "amount_micros": 100_000_000, "period": "month", "spent_micros": 25_000_000}
    ]
    transport = fake_gateway({("PUT", "/api/v1/budgets"): put, ("GET", "/api/v1/budgets"): lambda r: (200, listed)})
    code, out, _ = run(["budgets", "set", "team", "search", "$100", "--period", "week"], transport)
    assert code == 0 and sent == [{"scope": "team", "name": "search", "amount_micros": 100_000_000, "period": "week"}]
    assert "100.00 a week" in out
    code, out, _ = run(["budgets", "list"], transport)
    assert code == 0 and "25%" in out


@pytest.mark.parametrize(("text", "micros"), [("100", 100_000_000), ("12.50", 12_500_000), ("$0.000001", 1)])
def test_amounts(text, micros):
    assert amount_micros(text) == micros


def test_a_bad_amount_is_refused_before_asking_the_server():
    transport = fake_gateway({})
    code, _, err = run(["budgets", "set", "team", "search", "lots"], transport)
    assert code == 1 and "like 100 or 12.50" in err


def test_usage_asks_by_scope_and_since_and_shows_the_budget_share():
    asked = []
    rows = [
        {
            "scope": "team",
            "id": "1",
            "name": "search",
            "keys": 2,
            "requests": 10,
            "prompt_tokens": 100,
            "completion_tokens": 50,
            "cost_micros": 1_500_000,
            "errors": 1,
            "budget_micros": 10_000_000,
            "budget_period": "month",
            "fraction": 0.15,
        },
        {
            "scope": "team",
            "id": "2",
            "name": "ads",
            "keys": 1,
            "requests": 0,
            "prompt_tokens": 0,
            "completion_tokens": 0,
            "cost_micros": 0,
            "errors": 0,
        },
    ]

    def usage(request):
        asked.append(dict(request.url.params))
        return 200, rows

    transport = fake_gateway({("GET", "/api/v1/usage"): usage})
    code, out, _ = run(["usage", "--by", "org", "--since", "7d"], transport)
    assert code == 0 and asked == [{"by": "org", "since": "7d"}]
    assert "1.50" in out and "10.00/month (15%)" in out
    code, out, _ = run(["usage"], transport)
    assert asked[-1] == {"by": "team", "since": "24h"}


def test_the_servers_sentence_is_printed_and_the_status_is_non_zero():
    transport = fake_gateway(
        {("GET", "/api/v1/usage"): lambda r: (400, {"error": "since must be a positive duration, like 24h"})}
    )
    code, out, err = run(["usage", "--since=-1h"], transport)
    assert (code, out) == (1, "") and err.strip() == "llmgw ctl: since must be a positive duration, like 24h"


def test_an_answer_without_a_sentence_still_says_what_happened():
    transport = httpx.MockTransport(lambda r: httpx.Response(502, text="<html>bad gateway</html>"))
    code, _, err = run(["status"], transport)
    assert code == 1 and "502 Bad Gateway" in err


def test_flags_beat_the_environment_which_beats_the_file(tmp_path):
    path = tmp_path / "ctl.yaml"
    path.write_text("server: http://file:8000\ntoken: from-file\nactor: filer\n")
    assert resolve(path=path, env={}) == resolve(path=path, env={}) and resolve(path=path, env={}).token == "from-file"
    env = {"LLMGW_URL": "http://env:8000/", "LLMGW_TOKEN": "from-env"}
    chosen = resolve(path=path, env=env)
    assert (chosen.server, chosen.token, chosen.actor) == ("http://env:8000", "from-env", "filer")
    chosen = resolve("https://flag", "from-flag", path=path, env=env)
    assert (chosen.server, chosen.token) == ("https://flag", "from-flag")


@pytest.mark.parametrize("text", ["- just\n- a list\n", "server: [unclosed\n"])
def test_a_config_file_ctl_cannot_use_is_named(tmp_path, text):
    path = tmp_path / "ctl.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=str(path)):
        resolve(path=path, env={})


def test_a_server_that_is_not_a_url_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="http://"):
        resolve("control:8000", path=tmp_path / "none.yaml", env={})
