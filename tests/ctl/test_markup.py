"""Whatever text the server sends — a node's name, a shard's error, a log line, a refusal — ctl prints it as text.

The answers are the real API's, captured once from a fleet with faults; then every string in
them is replaced by an arbitrary one (``[rank0]``, ``[/models/x]``, ``[bold]``, a backslash, an
escape sequence) and every command is run on them. Each must succeed, print the string as it
is, and let no terminal control character through.
"""

from __future__ import annotations

import json
import string

import httpx
import pytest
from django.test import Client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.simulator import fleet as F
from catalog.models import CapacityMeasurement
from core.models import ApiToken
from gateway.models import Budget
from gateway.writes import keys
from inventory.models import Node
from placement.models import Replica
from tests import people
from tests.api.fleet import add_model, ingest, ingest_fleet, place
from tests.ctl.transport import run

pytestmark = pytest.mark.django_db

# Each command, as argv; its requests are answered from what the real API said to them.
COMMANDS = [
    ["status"],
    ["nodes"],
    ["node", "hgx-000"],
    ["logs", "hgx-000"],
    ["nvlink"],
    ["fabrics"],
    ["models"],
    ["replicas"],
    ["explain", "llama-8b"],
    ["what-if", "lose", "hgx-000"],
    ["capacity"],
    ["orphans"],
    ["collect"],
    ["cordon", "hgx-001"],
    ["scale", "llama-8b", "1", "2"],
    ["keys", "list"],
    ["keys", "create", "--team", "search"],
    ["budgets", "list"],
    ["budgets", "set", "team", "search", "5"],
    ["usage"],
]
MARKUP_LIKE = ["[rank0]", "[/models/x]", "[bold]", "[/]", "\\", "[", "]", ":smile:", "[red]x[/red]", "[link=x]"]
# Visible text: printed exactly as sent. Longer strings are cut by the tables' date columns (19).
visible = st.one_of(
    st.sampled_from(MARKUP_LIKE),
    st.text(alphabet=string.ascii_letters + string.digits + "[]/\\:=#@-_.", min_size=1, max_size=19),
)
anything = st.text(max_size=30)


def _fleet_with_faults() -> None:
    sims = {s.name: s for s in ingest_fleet("gb200-nvl72:1,h100-hgx:2@north,a100-mig:1")}
    F.gpu_lost(sims["hgx-001"], 3)
    ingest(sims["hgx-001"])
    model = add_model()
    replica = place(model, "hgx-000", [0, 1], state="starting", shard_state="fetching")
    Replica.objects.filter(pk=replica.pk).update(error="engine exited")
    Node.objects.filter(name="hgx-000").update(
        shard_status=[{"id": f"{replica.id}-0", "state": "failed", "error": "boom", "log_tail": ["[rank0] ready"]}],
        weights=[{"path": "/models/old", "bytes": 2_000_000_000}],
    )
    CapacityMeasurement.objects.create(
        model_name="llama-8b", profile_name="h100", measurement={"tokens_per_second": 900}, measured_by="bench"
    )
    key = keys.issue(team="search", org="acme", models=["llama"]).key
    Budget.objects.create(scope="team", team=key.team, amount_micros=100)


@pytest.fixture
def answers(db) -> dict[tuple[str, str], tuple[int, object]]:
    """What the real API answered to every request the commands make, by (method, path)."""
    _fleet_with_faults()
    _, secret = ApiToken.issue(people.operator("olivia"), "laptop")
    django = Client(HTTP_AUTHORIZATION=f"Bearer {secret}")
    captured: dict[tuple[str, str], tuple[int, object]] = {}

    def capture(request: httpx.Request) -> httpx.Response:
        answer = django.generic(
            request.method, request.url.raw_path.decode(), data=request.read(), content_type="application/json"
        )
        captured[(request.method, request.url.raw_path.decode())] = (answer.status_code, answer.json())
        return httpx.Response(answer.status_code, content=answer.content)

    for argv in COMMANDS:
        code, _, err = run(argv, httpx.MockTransport(capture))
        assert code == 0, (argv, err)
    return captured


def replaced(value, text: str):
    """``value`` with every string in it (not the keys) replaced by ``text``."""
    if isinstance(value, str):
        return text
    if isinstance(value, list):
        return [replaced(v, text) for v in value]
    if isinstance(value, dict):
        return {k: replaced(v, text) for k, v in value.items()}
    return value


def serving(answers, text: str, *, refuse: bool = False) -> httpx.MockTransport:
    def handle(request: httpx.Request) -> httpx.Response:
        if refuse:
            return httpx.Response(400, json={"error": text})
        status, body = answers[(request.method, request.url.raw_path.decode())]
        return httpx.Response(status, content=json.dumps(replaced(body, text)))

    return httpx.MockTransport(handle)


def no_control_characters(out: str) -> bool:
    return not any((ord(c) < 32 and c not in "\n\t") or 0x7F <= ord(c) < 0xA0 for c in out)


SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(autouse=True)
def wide(monkeypatch, tmp_path):
    monkeypatch.setenv("COLUMNS", "3000")  # no table wraps or cuts a cell
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))


@SETTINGS
@given(text=visible)
def test_every_command_prints_server_text_as_it_was_sent(answers, text):
    transport = serving(answers, text)
    for argv in COMMANDS:
        code, out, err = run(argv, transport)
        assert code == 0, (argv, err)
        assert text in out, (argv, out)


@SETTINGS
@given(text=anything)
def test_no_server_text_crashes_ctl_or_reaches_the_terminal_as_control(answers, text):
    transport = serving(answers, text)
    for argv in COMMANDS:
        code, out, err = run(argv, transport)
        assert code == 0, (argv, err)
        assert no_control_characters(out), (argv, out)


@SETTINGS
@given(text=st.one_of(visible, anything))
def test_a_refusal_is_printed_as_the_servers_sentence(answers, text):
    code, out, err = run(["nodes"], serving(answers, text, refuse=True))
    assert code == 1 and out == ""
    assert no_control_characters(err)
    if text.strip() and text.isprintable():
        assert text.strip() in err
