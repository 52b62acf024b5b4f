"""LoRA adapters as models through the real gateway on PostgreSQL: allowed, priced, budgeted and routed on their own.

An adapter is served by its base model's replicas; the gateway sends its
requests first to those that report it loaded, naming the adapter upstream
(as the fake engine checks, the way vLLM answers 404 for a name it does not
serve).
"""

from __future__ import annotations

import asyncio

import pytest

from catalog.models import Adapter
from gateway.models import Budget, Price, UsageRecord
from gateway.writes import budgets, keys
from tests.gateway.harness import call, model, new_app, replica, settle

pytestmark = pytest.mark.django_db(transaction=True)

CHAT = {"messages": [{"role": "user", "content": "write the query"}], "max_tokens": 8}


def lora_fleet(engines):
    """Model ``llama`` (free) with adapter ``llama-sql`` (priced); one replica has the adapter, one has not."""
    base = model("llama")
    adapter = Adapter.objects.create(model=base, name="llama-sql", source="hf://acme/llama-sql-lora")
    Price.objects.create(adapter=adapter, prompt_micros_per_million=1_000_000, completion_micros_per_million=2_000_000)
    with_it = engines(name="llama", lora=True, adapters={"llama-sql": "/adapters/sql"})
    without = engines(name="llama", lora=True)
    r_with = replica(base, with_it.url, engine="vllm")
    r_with.adapters = ["llama-sql"]
    r_with.save(update_fields=["adapters"])
    r_without = replica(base, without.url, engine="vllm")
    return with_it, without, r_with, r_without


def test_an_adapter_request_goes_to_the_replica_that_has_it_named_as_the_adapter(engines):
    with_it, without, r_with, _ = lora_fleet(engines)
    secret = keys.issue(team="search", org="acme").secret
    app = new_app()

    async def scenario():
        adapter = [
            await call(app, "/v1/chat/completions", {**CHAT, "model": "llama-sql"}, key=secret) for _ in range(6)
        ]
        base = [await call(app, "/v1/chat/completions", {**CHAT, "model": "llama"}, key=secret) for _ in range(6)]
        await settle(app)
        return adapter, base

    adapter, base = asyncio.run(scenario())
    assert [a.status for a in adapter] == [200] * 6
    assert {a.headers["x-llmgw-replica"] for a in adapter} == {r_with.id}
    assert {a.headers["x-llmgw-model"] for a in adapter} == {"llama-sql"}
    assert [b["model"] for b in with_it.engine.stats.bodies[:6]] == ["llama-sql"] * 6
    assert all(b.status == 200 for b in base)
    assert {b["model"] for b in without.engine.stats.bodies} <= {"llama"}
    assert set(UsageRecord.objects.filter(requested="llama-sql").values_list("model", flat=True)) == {"llama-sql"}


def test_a_key_allows_an_adapter_by_its_own_name_and_lists_it_with_its_parent(engines):
    lora_fleet(engines)
    base_only = keys.issue(team="search", org="acme", models=["llama"]).secret
    adapter_only = keys.issue(team="search", org="acme", models=["llama-sql"]).secret
    app = new_app()

    async def scenario():
        out = {
            "base key, adapter": await call(app, "/v1/chat/completions", {**CHAT, "model": "llama-sql"}, key=base_only),
            "adapter key, adapter": await call(
                app, "/v1/chat/completions", {**CHAT, "model": "llama-sql"}, key=adapter_only
            ),
            "adapter key, base": await call(app, "/v1/chat/completions", {**CHAT, "model": "llama"}, key=adapter_only),
            "messages": await call(
                app, "/v1/messages", {**CHAT, "model": "llama-sql"}, headers={"x-api-key": base_only}
            ),
        }
        listed = {
            "base": await call(app, "/v1/models", method="GET", key=base_only),
            "adapter": await call(app, "/v1/models", method="GET", key=adapter_only),
        }
        await settle(app)
        return out, listed

    out, listed = asyncio.run(scenario())
    assert out["base key, adapter"].status == 403 and "llama-sql" in out["base key, adapter"].json()["error"]["message"]
    assert out["adapter key, adapter"].status == 200
    assert out["adapter key, base"].status == 403
    # The refusal of an adapter answers each protocol in its own shape.
    assert out["messages"].status == 403 and out["messages"].json()["type"] == "error"
    assert [m["id"] for m in listed["base"].json()["data"]] == ["llama"]
    assert listed["adapter"].json()["data"] == [
        {
            "id": "llama-sql",
            "object": "model",
            "created": listed["adapter"].json()["data"][0]["created"],
            "owned_by": "llmgw",
            "parent": "llama",
        }
    ]


def test_an_adapter_is_priced_and_budgeted_on_its_own(engines):
    lora_fleet(engines)
    issued = keys.issue(team="search", org="acme")
    # Enough for the free base model, never for one adapter request's largest cost.
    Budget.objects.create(scope="key", key=issued.key, amount_micros=10)
    app = new_app()

    async def scenario():
        base = await call(app, "/v1/chat/completions", {**CHAT, "model": "llama"}, key=issued.secret)
        adapter = await call(app, "/v1/chat/completions", {**CHAT, "model": "llama-sql"}, key=issued.secret)
        await settle(app)
        return base, adapter

    base, adapter = asyncio.run(scenario())
    assert base.status == 200
    assert adapter.status == 429 and adapter.json()["error"]["code"] == "budget_exceeded"
    assert UsageRecord.objects.get(requested="llama").cost_micros == 0

    Budget.objects.filter(key=issued.key).update(amount_micros=1_000_000)
    app = new_app()

    async def again():
        answer = await call(app, "/v1/chat/completions", {**CHAT, "model": "llama-sql"}, key=issued.secret)
        await settle(app)
        return answer

    assert asyncio.run(again()).status == 200
    record = UsageRecord.objects.get(requested="llama-sql", status=200)
    assert record.model == "llama-sql"
    assert record.cost_micros == budgets.cost_micros(
        record.prompt_tokens, record.completion_tokens, (1_000_000, 2_000_000)
    )
    assert Budget.objects.get(key=issued.key).spent_micros == record.cost_micros


def test_sglang_is_asked_for_an_adapter_as_base_colon_adapter(engines):
    base = model("llama")
    Adapter.objects.create(model=base, name="llama-sql", source="hf://acme/llama-sql-lora")
    engine = engines(name="llama")
    r = replica(base, engine.url, engine="sglang")
    r.adapters = ["llama-sql"]
    r.save(update_fields=["adapters"])
    secret = keys.issue(team="search", org="acme").secret
    app = new_app()

    async def scenario():
        answer = await call(app, "/v1/chat/completions", {**CHAT, "model": "llama-sql"}, key=secret)
        await settle(app)
        return answer

    assert asyncio.run(scenario()).status == 200
    assert engine.engine.stats.bodies[-1]["model"] == "llama:llama-sql"


def test_a_llamacpp_replica_with_the_adapter_serves_it_only_once_no_vllm_replica_with_it_is_left(engines):
    """llama.cpp reloads the model at each switch of name: its replicas come after vLLM's holding the adapter."""
    base = model("llama")
    Adapter.objects.create(model=base, name="llama-sql", source="hf://acme/llama-sql-lora")
    vllm_engine = engines(name="llama", lora=True, adapters={"llama-sql": "/adapters/sql"})
    llama_engine = engines(name="llama", lora=True, adapters={"llama-sql": "/adapters/sql.gguf"})
    bare = engines(name="llama", lora=True)
    on_vllm = replica(base, vllm_engine.url, engine="vllm")
    on_llamacpp = replica(base, llama_engine.url, engine="llamacpp")
    replica(base, bare.url, engine="vllm")
    for r in (on_vllm, on_llamacpp):
        r.adapters = ["llama-sql"]
        r.save(update_fields=["adapters"])
    secret = keys.issue(team="search", org="acme").secret
    app = new_app()

    async def scenario(n: int):
        body = {**CHAT, "model": "llama-sql"}
        answers = [await call(app, "/v1/chat/completions", body, key=secret) for _ in range(n)]
        await settle(app)
        return answers

    first = asyncio.run(scenario(4))
    assert [a.status for a in first] == [200] * 4 and {a.headers["x-llmgw-replica"] for a in first} == {on_vllm.id}
    on_vllm.state = "failed"
    on_vllm.save(update_fields=["state"])
    app = new_app()
    then = asyncio.run(scenario(4))
    assert [a.status for a in then] == [200] * 4 and {a.headers["x-llmgw-replica"] for a in then} == {on_llamacpp.id}
    assert [b["model"] for b in llama_engine.engine.stats.bodies] == ["llama-sql"] * 4, "named as its alias"
    assert not bare.engine.stats.bodies


def test_an_adapter_no_ready_replica_holds_is_503_and_never_answered_by_the_base(engines):
    """A replica of the base without the adapter would answer 404 (vLLM) or as the base model itself
    (llama.cpp's server falls back to its first name): neither is asked."""
    base = model("llama")
    Adapter.objects.create(model=base, name="llama-sql", source="hf://acme/llama-sql-lora")
    on_vllm = engines(name="llama", lora=True)
    on_llamacpp = engines(name="llama", lora=True)
    replica(base, on_vllm.url, engine="vllm")
    replica(base, on_llamacpp.url, engine="llamacpp")
    secret = keys.issue(team="search", org="acme").secret
    app = new_app()

    async def scenario():
        chat = await call(app, "/v1/chat/completions", {**CHAT, "model": "llama-sql"}, key=secret)
        messages = await call(app, "/v1/messages", {**CHAT, "model": "llama-sql"}, headers={"x-api-key": secret})
        base_answer = await call(app, "/v1/chat/completions", {**CHAT, "model": "llama"}, key=secret)
        await settle(app)
        return chat, messages, base_answer

    chat, messages, base_answer = asyncio.run(scenario())
    assert chat.status == 503 and "adapter 'llama-sql' is not loaded" in chat.json()["error"]["message"]
    assert messages.status == 503 and messages.json()["type"] == "error"
    assert base_answer.status == 200, "the base itself is served as before"
    asked = [b["model"] for e in (on_vllm, on_llamacpp) for b in e.engine.stats.bodies]
    assert asked == ["llama"], "no engine was asked for the adapter"
    assert UsageRecord.objects.filter(requested="llama-sql", status=503).count() == 2
