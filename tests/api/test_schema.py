"""The OpenAPI schema against a live server on a simulated fleet: no 500 and no answer that breaks the schema.

Schemathesis generates requests from /api/v1/schema — valid ones, and
invalid ones that must be refused with a 4xx — and checks every answer. The
examples are bounded so the run stays well under two minutes.
"""

from __future__ import annotations

import contextlib

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.generation import GenerationMode
from schemathesis.specs.openapi.checks import response_schema_conformance

from tests.api.live import PLACE, live_fleet

pytestmark = pytest.mark.slow

EXAMPLES = {GenerationMode.POSITIVE: 20, GenerationMode.NEGATIVE: 10}


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    with live_fleet(tmp_path_factory.mktemp("schema"), "gb200-nvl72:1,h100-hgx:2@north,a100-mig:1,cpu:1", 22) as live:
        live.shell(PLACE)
        yield live


def test_every_list_has_something_in_it(live):
    for path in ("/api/v1/nodes", "/api/v1/replicas", "/api/v1/models", "/api/v1/weights/orphans"):
        answer = live.get(path).json()
        assert answer if isinstance(answer, list) else answer["orphans"], path
    assert live.get("/api/v1/nvlink").json()["domains"]


@pytest.mark.parametrize("mode", list(EXAMPLES), ids=lambda m: m.value)
def test_the_schema_holds_for_whatever_a_client_sends(live, mode):
    raw = live.get("/api/v1/schema").json()
    schema = schemathesis.openapi.from_dict(raw)
    auth = {"Authorization": f"Bearer {live.token}"}
    failures: list[str] = []
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 17

    for operation in operations:

        @settings(
            max_examples=EXAMPLES[mode],
            deadline=None,
            database=None,
            phases=[Phase.explicit, Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        @given(case=operation.as_strategy(generation_mode=mode))
        def check(case):
            response = case.call(base_url=live.url, headers=auth, timeout=30)
            try:
                case.validate_response(response, checks=[not_a_server_error, response_schema_conformance])
            except Exception as exc:
                failures.append(f"{case.method} {case.formatted_path} -> {response.status_code}: {exc}"[:2000])
                raise

        # Already recorded above with the request that failed; go on to the next operation.
        with contextlib.suppress(Exception):
            check()
    assert not failures, "\n\n".join(failures[:10])
    assert "Traceback" not in live.server.log.read_text(), live.server.log.read_text()[-5000:]


def test_a_listing_cut_by_fields_still_holds_the_schema(live):
    """``?fields=id`` leaves every other field out, which the listing's schema must allow."""
    schema = schemathesis.openapi.from_dict(live.get("/api/v1/schema").json())
    case = schema["/api/v1/nodes"]["GET"].Case(query={"fields": "id"})
    response = case.call(base_url=live.url, headers={"Authorization": f"Bearer {live.token}"}, timeout=30)
    assert response.status_code == 200 and all(list(n) == ["id"] for n in response.json())
    case.validate_response(response, checks=[response_schema_conformance])


def test_a_what_if_answer_holds_the_schema(live):
    """A node with a replica on it, and an unknown target: the answer and the refusal both hold."""
    schema = schemathesis.openapi.from_dict(live.get("/api/v1/schema").json())
    auth = {"Authorization": f"Bearer {live.token}"}
    for lose, status in (("hgx-000", 200), ("hgx-000,nvl72-00-tray-00", 200), ("no-such-rack", 400)):
        case = schema["/api/v1/what-if"]["GET"].Case(query={"lose": lose})
        response = case.call(base_url=live.url, headers=auth, timeout=30)
        assert response.status_code == status, response.text
        case.validate_response(response, checks=[response_schema_conformance])
    assert live.get("/api/v1/what-if?lose=hgx-000").json()["stopped"]
