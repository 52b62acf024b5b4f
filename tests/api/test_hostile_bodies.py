"""For any JSON within the body limit, on every write endpoint of the admin listener, the answer is never a 5xx.

The endpoints are read from the OpenAPI schema (so a new one is covered the day it is added);
each is sent, by an operator's token: arbitrary JSON (nested, huge and non-finite numbers, NUL
and long strings, wrong types), objects whose keys are the endpoint's own field names with
such values, nesting just past the reader's limit and far past it, and bytes that are not JSON.
Path parameters are real names or hostile text. After each the server still answers.
"""

from __future__ import annotations

import json
from urllib.parse import quote

import pytest
from drf_spectacular.generators import SchemaGenerator
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from rest_framework.test import APIClient

from api.base import JSON_BODY_LIMIT
from core.models import ApiToken
from gateway.writes import keys
from tests import people
from tests.api.fleet import MODEL, add_model, ingest_fleet, place

pytestmark = pytest.mark.django_db
WRITE_METHODS = ("post", "put", "patch", "delete")

# What every request-body field of the admin API is called, so that generated objects reach
# each view's own checks rather than stopping at "unknown field".
FIELDS = [
    *("state", "min", "max", "idle_timeout", "profile", "measured_at", "model", "nodes"),
    *("team", "org", "models", "name", "scope", "amount_micros", "period"),
    *("source", "aliases", "scaling", "profiles", "fallbacks", "engine", "gpu_class", "gpus", "tp", "env"),
    *("engine_args", "memory_gb", "pool", "tokens_per_second", "max_concurrency"),
]


def write_endpoints() -> list[tuple[str, str]]:
    """(method, path template) for every write operation the schema lists."""
    schema = SchemaGenerator().get_schema(request=None, public=True)
    return sorted(
        (method, path) for path, item in schema["paths"].items() for method in item if method in WRITE_METHODS
    )


def test_the_schema_lists_every_write_endpoint_of_both_apis():
    """The enumeration the property runs over is not quietly short of an endpoint."""
    listed = {path for _, path in write_endpoints()}
    assert {
        "/api/v1/keys",
        "/api/v1/keys/{key_id}/revoke",
        "/api/v1/budgets",
        "/api/v1/models",
        "/api/v1/models/{name}/scale",
        "/api/v1/models/{name}/capacity",
        "/api/v1/nodes/{name}/state",
        "/api/v1/weights/collect",
        "/api/v1/fabrics/{fabric}/scan",
    } <= listed


ENDPOINTS = write_endpoints()
hostile_text = st.one_of(
    st.text(max_size=40),
    st.text(alphabet="\x00\ud800[]/%.\\", max_size=10),
    st.integers(min_value=100, max_value=5000).map(lambda n: "x" * n),
)
number = st.one_of(
    st.integers(),
    st.integers(min_value=2**62, max_value=2**70),
    st.integers(max_value=-(2**31)),
    st.just(10**400),
    st.floats(),  # NaN and ±Infinity included: json.dumps writes them, Python's reader accepts them
)
leaf = st.one_of(st.none(), st.booleans(), number, hostile_text)
json_value = st.recursive(
    leaf, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(hostile_text, inner, max_size=4), max_leaves=12
)
object_of_fields = st.dictionaries(st.sampled_from(FIELDS), json_value, max_size=6)


def nested(depth: int) -> bytes:
    return b'{"team": ' + b"[" * depth + b"]" * depth + b"}"


raw_body = st.one_of(
    json_value.map(lambda v: json.dumps(v).encode()),
    object_of_fields.map(lambda v: json.dumps(v).encode()),
    st.sampled_from([63, 64, 65, 999, 5000, 100_000]).map(nested),
    st.binary(max_size=40),
)


@pytest.fixture
def world(db):
    """A fleet, a model, a key and an operator's client: the real names path parameters can take."""
    ingest_fleet("h100-hgx:1@north")
    model = add_model()
    place(model, "hgx-000", [0])
    key = keys.issue(team="search").key
    _, secret = ApiToken.issue(people.operator("olivia"), "laptop")
    client = APIClient(raise_request_exception=True)
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    real = {"name": MODEL["name"], "key_id": key.id, "fabric": "north"}
    return client, real


def fill(template: str, real: dict, params: dict) -> str:
    path = template
    for name, value in params.items():
        text = value if value is not None else real.get(name, "x")
        # A lone surrogate is sent as the bytes it would be (invalid UTF-8), as a hostile client can.
        path = path.replace("{" + name + "}", quote(text.encode("utf-8", "surrogatepass"), safe=""))
    return path


def path_params(template: str) -> list[str]:
    return [part[1:-1] for part in template.split("/") if part.startswith("{")]


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data(), endpoint=st.sampled_from(ENDPOINTS), body=raw_body)
def test_no_body_on_any_admin_write_endpoint_is_a_server_error(world, data, endpoint, body):
    client, real = world
    method, template = endpoint
    params = {p: data.draw(st.one_of(st.none(), hostile_text), label=p) for p in path_params(template)}
    assert len(body) <= JSON_BODY_LIMIT
    path = fill(template, real, params)
    answer = client.generic(method.upper(), path, body, content_type="application/json")
    event(f"{method} {template} {answer.status_code}")
    assert answer.status_code < 500, (method, path, body[:200], answer.content[:500])
    assert "error" in answer.json() or answer.status_code < 300
    assert client.get("/api/v1/nodes/hgx-000").status_code == 200, "the server still answers"


def test_nan_and_infinity_are_refused_with_a_sentence(world):
    client, _ = world
    answer = client.put(
        f"/api/v1/models/{MODEL['name']}/capacity",
        b'{"profile": "h100", "tokens_per_second": NaN}',
        content_type="application/json",
    )
    assert answer.status_code == 400 and "NaN" in answer.json()["error"]


def test_nesting_past_the_shared_readers_limit_is_refused_on_every_endpoint(world):
    client, real = world
    for method, template in ENDPOINTS:
        path = fill(template, real, dict.fromkeys(path_params(template)))
        answer = client.generic(method.upper(), path, b"[" * 65 + b"]" * 65, content_type="application/json")
        assert answer.status_code == 400, (method, path)
        assert "nested deeper than 64 levels" in answer.json()["error"], (method, path)
