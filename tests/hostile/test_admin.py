"""Every write of the admin API (each POST, PUT, PATCH and DELETE under /api/v1 but the agent's), mutated.

The writes are read from the live server's OpenAPI schema, so a new endpoint
without a base request here fails the suite rather than going unwalked. Each
base is a request that succeeds (the tests in tests/api and tests/ctl send
the same); its body's leaves, its path parameters and its actor header are
then mutated one at a time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import quote

import httpx
import pytest

from tests.hostile import mutants as M
from tests.hostile.fleet import A, C, Hostile
from tests.hostile.probe import dumps, tally

pytestmark = [pytest.mark.slow, pytest.mark.hostile]

ADDED = {
    "name": "hostile-added",
    "description": "A model the suite adds and removes",
    "source": "https://example.org/qwen2.5-0.5b-instruct-q4_k_m.gguf",
    "aliases": ["hostile-added-alias"],
    "fallbacks": ["hostile-chat"],
    "adapters": [{"name": "hostile-added-sql", "source": "hf://acme/hostile-added-sql-lora"}],
    "scaling": {"min": 0, "max": 1, "idle_timeout": "30m"},
    "profiles": [
        {
            "name": "cpu",
            "engine": "llamacpp",
            "gpu_class": "cpu",
            "memory_gb": 2,
            "gpus": 0,
            "nodes": 1,
            "tp": 1,
            "pp": 1,
            "pool": "batch",
            "engine_args": ["--n_ctx", "4096"],
            "env": {"OMP_NUM_THREADS": "2"},
        }
    ],
}


def simple_model(name: str) -> dict:
    return {
        "name": name,
        "source": "https://example.org/qwen2.5-0.5b-instruct-q4_k_m.gguf",
        "scaling": {"min": 0, "max": 1},
        "profiles": [{"name": "cpu", "engine": "llamacpp", "gpu_class": "cpu", "memory_gb": 2, "gpus": 0}],
    }


@dataclass
class Op:
    """A write that succeeds, and how to put things back after a mutant that also succeeded."""

    params: dict[str, str] = field(default_factory=dict)
    body: dict | None = None
    prepare: Callable[[Hostile], None] | None = None
    undo: Callable[[Hostile, httpx.Response], None] | None = None


def make_model(definition: dict) -> Callable[[Hostile], None]:
    def prepare(h: Hostile) -> None:
        answer = h.admin.post("/api/v1/models", json=definition)
        assert answer.status_code in (201, 409), answer.text

    return prepare


def remove_added(h: Hostile, answer: httpx.Response) -> None:
    """A model a mutant managed to add is removed, so the next mutant is not refused as a duplicate."""
    try:
        name = answer.json().get("name")
    except ValueError:
        return
    if isinstance(name, str) and name:
        h.admin.delete(f"/api/v1/models/{quote(name, safe='')}")


def uncordon(h: Hostile, answer: httpx.Response) -> None:
    h.admin.post(f"/api/v1/nodes/{C}/state", json={"state": "uncordon"})


def fresh_key(h: Hostile) -> str:
    answer = h.admin.post("/api/v1/keys", json={"team": "hostile-admin", "org": "hostile-org", "name": "to revoke"})
    assert answer.status_code == 201, answer.text
    return answer.json()["id"]


def operations(h: Hostile) -> dict[tuple[str, str], Op]:
    """A base request for every write the schema lists, keyed by (method, path template)."""
    return {
        ("POST", "/api/v1/keys"): Op(
            body={"team": "hostile-admin", "org": "hostile-org", "models": ["hostile-chat"], "name": "hostile admin"}
        ),
        ("POST", "/api/v1/keys/{key_id}/revoke"): Op(params={"key_id": fresh_key(h)}),
        ("PUT", "/api/v1/budgets"): Op(
            body={"scope": "team", "name": "hostile-admin", "amount_micros": 5_000_000, "period": "month"}
        ),
        ("POST", "/api/v1/models"): Op(body=ADDED, undo=remove_added),
        ("DELETE", "/api/v1/models/{name}"): Op(
            params={"name": "hostile-doomed"}, prepare=make_model(simple_model("hostile-doomed"))
        ),
        ("PUT", "/api/v1/models/{name}/capacity"): Op(
            params={"name": "hostile-chat"},
            body={"profile": "cpu", "tokens_per_second": 900, "rps": 3.5, "measured_at": "2026-10-05T14:00:00Z"},
        ),
        ("POST", "/api/v1/models/{name}/scale"): Op(
            params={"name": "hostile-scaled"},
            body={"min": 0, "max": 2, "idle_timeout": "30m"},
            prepare=make_model(simple_model("hostile-scaled")),
        ),
        ("POST", "/api/v1/nodes/{name}/state"): Op(params={"name": C}, body={"state": "cordon"}, undo=uncordon),
        ("POST", "/api/v1/weights/collect"): Op(body={"nodes": [C]}),
        ("POST", "/api/v1/fabrics/{fabric}/scan"): Op(params={"fabric": h.fabric_ids[A]}),
        ("POST", "/api/v1/models/{name}/prefetch"): Op(
            params={"name": "hostile-prefetched"},
            body={"nodes": [C]},
            prepare=make_model(simple_model("hostile-prefetched")),
        ),
        ("POST", "/api/v1/moves/resume"): Op(),
    }


def schema_writes(h: Hostile) -> list[tuple[str, str]]:
    answer = h.admin.get("/api/v1/schema")
    assert answer.status_code == 200, answer.text
    writes = []
    for path, methods in answer.json()["paths"].items():
        for method in methods:
            if method in ("post", "put", "patch", "delete") and not path.startswith("/api/v1/agent/"):
                writes.append((method.upper(), path))
    return sorted(writes)


def url(template: str, params: dict[str, str]) -> str:
    for name, value in params.items():
        template = template.replace("{" + name + "}", quote(value, safe=""))
    return template


def test_every_leaf_of_every_admin_write(hostile: Hostile):
    h, t = hostile, tally("admin")
    ops = operations(h)
    for method, template in schema_writes(h):
        op = ops.get((method, template))
        if op is None:
            t.fail(f"admin: {method} {template} is in the schema, and this suite has no base request for it")
            continue
        walk(h, t, method, template, op)
    assert t.verdict() is None, t.verdict()


def walk(h: Hostile, t, method: str, template: str, op: Op) -> None:
    """The actor header and the base first (each on prepared ground), then the body's leaves and the path's."""

    def prepare() -> None:
        if op.prepare:
            op.prepare(h)
            h.prober.forget()

    label = f"{method} {template}"

    def send(where: str, mutant: str, path: str, body, headers: dict | None = None) -> httpx.Response | None:
        def request() -> httpx.Response:
            content = None if body is None else dumps(body)
            extra = {"content-type": "application/json"} if content is not None else {}
            return h.admin.request(method, path, content=content, headers={**extra, **(headers or {})})

        answer = h.prober.send(t, f"{label} {where}", mutant, request)
        if answer is not None and answer.is_success and op.undo:
            op.undo(h, answer)
            h.prober.forget()
        return answer

    prepare()
    long_actor = {"X-Llmgw-Actor": M.LONG}
    send("header X-Llmgw-Actor", "long string (10,000 chars)", url(template, op.params), op.body, long_actor)
    prepare()
    base = send("(the base request)", "(unchanged)", url(template, op.params), op.body)
    if base is None or not base.is_success:
        got = "no answer" if base is None else f"{base.status_code} {base.text[:300]}"
        t.fail(f"admin: {label}: the base request itself was not accepted: {got}")
    if op.body is not None:
        for case in M.cases(op.body):
            send(f"body.{case.where}", str(case.mutant), url(template, op.params), case.doc)
        for mutant in (M.Mutant("body: a list", [op.body]), M.Mutant("body: nested 100 deep", M.deep())):
            send("(the body)", str(mutant), url(template, op.params), mutant.value)
    for name in op.params:
        for mutant in M.PATH_TEXT:
            send(f"path {{{name}}}", str(mutant), url(template, {**op.params, name: mutant.value}), op.body)
