"""The gateway as clients meet it: ``llmgw serve`` subprocesses on the test database, fake engines.

The servers share this test's PostgreSQL database, so the rows written here
(models, replicas, keys) are what they serve, and nothing else: keys are
stored as their SHA-256, so the servers know them with no secret shared.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from pathlib import Path

import anthropic
import httpx
import openai
import pytest
from django.db import connection
from django.utils import timezone

from catalog.models import Adapter
from core.models import ApiToken
from gateway.models import ApiKey, Budget, Lease, UsageRecord
from gateway.tasks import reap_leases
from llmgw.celery import beat_schedule
from placement.models import Replica
from tests import people
from tests.core.test_serve import Server, descendants
from tests.gateway.harness import key, model, replica

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]
REDIS_URL = os.environ.get("LLMGW_TEST_GATEWAY_REDIS_URL", "redis://127.0.0.1:6379/7")


def server_env() -> dict[str, str]:
    params = connection.settings_dict
    url = f"postgresql://{params['USER']}@{params['HOST'] or '127.0.0.1'}:{params['PORT'] or 5432}/{params['NAME']}"
    return {
        "LLMGW_DATABASE_URL": url,
        "LLMGW_GATEWAY_REFRESH_S": "0.1",
        # No background writes of replicas' last use while a test's tables are emptied.
        "LLMGW_GATEWAY_TOUCH_EVERY_S": "3600",
    }


@pytest.fixture(scope="module")
def server(django_db_setup, django_db_blocker, tmp_path_factory):
    with django_db_blocker.unblock():
        env = server_env()
    started = Server(tmp_path_factory.mktemp("serve"), **env)
    try:
        started.wait_ready()
        yield started
    finally:
        started.stop()


def wait_for(condition, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("the condition never held")


def test_the_openai_client_chats_through_llmgw_serve_plain_and_streaming(server, engines):
    engine = engines(tokens=4, lockstep=True)
    replica(model("llama", aliases=["chat"]), engine.url)
    client = openai.OpenAI(base_url=f"http://{server.gateway}/v1", api_key=key())

    assert [m.id for m in client.models.list()] == ["llama", "chat"]
    answer = client.chat.completions.create(model="chat", messages=[{"role": "user", "content": "hello there"}])
    assert answer.choices[0].message.content == "w0 w1 w2 w3"
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (2, 4)

    text = ""
    stream = client.chat.completions.create(
        model="llama", messages=[{"role": "user", "content": "hello there"}], stream=True
    )
    for chunk in stream:
        text += chunk.choices[0].delta.content or ""
        engine.saw(text)
    assert text == "w0 w1 w2 w3 "
    # Each token reached the client before the engine sent the next, not all at the end. (How soon the
    # first one comes is a speed, measured by bench/gateway.py.)
    assert engine.stats.unseen == 0

    records = wait_for(lambda: list(UsageRecord.objects.order_by("at")) if UsageRecord.objects.count() == 2 else None)
    assert [(r.stream, r.prompt_tokens, r.completion_tokens, r.counted_by) for r in records] == [
        (False, 2, 4, "engine"),
        (True, 2, 4, "engine"),
    ]

    with pytest.raises(openai.AuthenticationError) as refused:
        openai.OpenAI(base_url=f"http://{server.gateway}/v1", api_key="sk-llmgw-wrong").models.list()
    assert "not known" in str(refused.value)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "hi"}])


def test_the_openai_and_anthropic_clients_ask_for_a_lora_adapter_by_name_through_llmgw_serve(server, engines):
    engine = engines(name="llama", lora=True, adapters={"llama-sql": "/adapters/sql"})
    base = model("llama")
    Adapter.objects.create(model=base, name="llama-sql", source="hf://acme/llama-sql-lora")
    r = replica(base, engine.url, engine="vllm")
    Replica.objects.filter(pk=r.pk).update(adapters=["llama-sql"])
    secret = key(models=["llama-sql"])
    client = openai.OpenAI(base_url=f"http://{server.gateway}/v1", api_key=secret)

    assert [(m.id, getattr(m, "parent", None)) for m in client.models.list()] == [("llama-sql", "llama")]
    answer = client.chat.completions.create(model="llama-sql", messages=[{"role": "user", "content": "hi"}])
    assert answer.model == "llama-sql" and answer.choices[0].message.content
    stream = client.chat.completions.create(
        model="llama-sql", messages=[{"role": "user", "content": "hi"}], stream=True
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    message = anthropic.Anthropic(base_url=f"http://{server.gateway}", api_key=secret).messages.create(
        model="llama-sql", max_tokens=8, messages=[{"role": "user", "content": "hi"}]
    )
    assert message.content[0].text
    assert {b["model"] for b in engine.engine.stats.bodies} == {"llama-sql"}
    with pytest.raises(openai.PermissionDeniedError):
        client.chat.completions.create(model="llama", messages=[{"role": "user", "content": "hi"}])
    records = wait_for(
        lambda: list(UsageRecord.objects.filter(status=200)) if UsageRecord.objects.count() == 4 else None
    )
    assert {r.model for r in records} == {"llama-sql"}


def test_the_anthropic_client_talks_through_llmgw_serve_translated_and_native_plain_and_streaming(server, engines):
    translated = engines(tokens=4, lockstep=True)  # speaks chat only: Messages are translated for it
    native = engines(tokens=3, messages=True)  # serves /v1/messages itself, as vLLM does
    replica(model("llama"), translated.url)
    replica(model("qwen"), native.url, engine="vllm")
    client = anthropic.Anthropic(base_url=f"http://{server.gateway}", api_key=key(), max_retries=0)
    hello = [{"role": "user", "content": "hello there"}]

    answer = client.messages.create(model="llama", max_tokens=50, system="be brief", messages=hello)
    assert answer.content[0].text == "w0 w1 w2 w3" and answer.stop_reason == "end_turn"
    assert (answer.usage.input_tokens, answer.usage.output_tokens) == (4, 4)
    with client.messages.stream(model="llama", max_tokens=50, messages=hello) as stream:
        for text in stream.text_stream:
            translated.saw(text)
        final = stream.get_final_message()
    assert final.content[0].text == "w0 w1 w2 w3 " and final.stop_reason == "end_turn"
    assert final.usage.output_tokens == 4
    assert translated.stats.unseen == 0  # each token reached the client before the engine sent the next

    answer = client.messages.create(model="qwen", max_tokens=50, messages=hello)
    assert (answer.id, answer.content[0].text, answer.usage.output_tokens) == ("msg_fake", "w0 w1 w2", 3)
    with client.messages.stream(model="qwen", max_tokens=50, messages=hello) as stream:
        assert "".join(stream.text_stream) == "w0 w1 w2 "
        assert stream.get_final_message().usage.output_tokens == 3
    assert [b.get("stream", False) for b in native.stats.bodies] == [False, True]
    assert all("messages" in b and "stream_options" not in b for b in native.stats.bodies)  # untouched

    records = wait_for(lambda: list(UsageRecord.objects.order_by("at")) if UsageRecord.objects.count() == 4 else None)
    assert [(r.model, r.endpoint, r.stream, r.prompt_tokens, r.completion_tokens) for r in records] == [
        ("llama", "messages", False, 4, 4),
        ("llama", "messages", True, 2, 4),
        ("qwen", "messages", False, 2, 3),
        ("qwen", "messages", True, 2, 3),
    ]


def test_budgets_allowed_models_and_rate_limits_answer_the_anthropic_client_in_its_shape(server, engines):
    engine = engines(tokens=4)
    replica(model("llama", price=(1_000_000, 1_000_000)), engine.url)
    replica(model("qwen"), engine.url)
    url = f"http://{server.gateway}"
    hello = {"max_tokens": 50, "messages": [{"role": "user", "content": "hello there"}]}
    only_qwen = anthropic.Anthropic(base_url=url, api_key=key(models=["qwen"]), max_retries=0)
    with pytest.raises(anthropic.PermissionDeniedError) as refused:
        only_qwen.messages.create(model="llama", **hello)
    assert "may not use model 'llama'" in refused.value.message
    assert refused.value.body["type"] == "error"
    broke = key(team="broke")
    Budget.objects.create(scope="key", key=ApiKey.objects.get(team__name="broke"), amount_micros=1, period="day")
    with pytest.raises(anthropic.RateLimitError) as refused:
        anthropic.Anthropic(base_url=url, api_key=broke, max_retries=0).messages.create(model="llama", **hello)
    assert "budget" in refused.value.message and refused.value.body["error"]["type"] == "rate_limit_error"
    limited = key(team="limited")
    ApiKey.objects.filter(team__name="limited").update(rpm=1)
    client = anthropic.Anthropic(base_url=url, api_key=limited, max_retries=0)
    assert client.messages.create(model="qwen", **hello).content[0].text == "w0 w1 w2 w3"
    with pytest.raises(anthropic.RateLimitError) as refused:
        client.messages.create(model="qwen", **hello)
    assert "per minute" in refused.value.message
    with pytest.raises(anthropic.BadRequestError) as refused:
        client.messages.create(model="qwen", max_tokens=5, messages=[{"role": "system", "content": "x"}])
    assert "role must be 'user' or 'assistant'" in refused.value.message
    with pytest.raises(anthropic.NotFoundError):
        only_qwen.messages.create(model="nope", **hello)
    # Each refusal after the key is known is recorded, as for chat (a bad body is refused before).
    wait_for(lambda: UsageRecord.objects.count() == 4)
    assert sorted(UsageRecord.objects.values_list("outcome", flat=True)) == sorted(
        ["model_not_allowed", "budget_exceeded", "ok", "rate_limit_exceeded"]
    )


def test_a_lone_surrogate_is_a_400_in_each_protocols_shape_through_llmgw_serve(server, engines):
    engine = engines()
    replica(model("llama"), engine.url)
    secret = key()
    bodies = {
        "chat/completions": '{"model": "llama", "messages": [{"role": "user", "content": "\\ud800"}]}',
        "completions": '{"model": "llama", "prompt": "hi", "\\udfff": 1}',
        "embeddings": '{"model": "llama", "input": ["ok", "\\ud83d"]}',
        "messages": '{"model": "llama", "max_tokens": 5, "messages": [{"role": "user", "content": "\\ud800"}]}',
        "responses": '{"model": "\\ud800", "input": "hi"}',
    }
    for endpoint, raw in bodies.items():
        for headers in ({}, {"Authorization": f"Bearer {secret}"}):
            answer = httpx.post(f"http://{server.gateway}/v1/{endpoint}", content=raw.encode(), headers=headers)
            assert answer.status_code == 400, (endpoint, answer.text)
            error = answer.json()["error"]
            assert error["type"] == "invalid_request_error" and "lone surrogate" in error["message"]
            if endpoint == "messages":
                assert answer.json()["type"] == "error"
    assert engine.stats.requests == 0 and not UsageRecord.objects.exists()


def test_the_openai_client_asks_for_responses_through_llmgw_serve_plain_and_streaming(server, engines):
    engine = engines(tokens=4, lockstep=True)
    replica(model("llama"), engine.url)
    client = openai.OpenAI(base_url=f"http://{server.gateway}/v1", api_key=key(), max_retries=0)

    answer = client.responses.create(model="llama", instructions="be brief", input="hello there", max_output_tokens=50)
    assert answer.output_text == "w0 w1 w2 w3" and answer.status == "completed"
    assert (answer.usage.input_tokens, answer.usage.output_tokens) == (4, 4)
    deltas, done = [], None
    for event in client.responses.create(model="llama", input="hello there", stream=True):
        if event.type == "response.output_text.delta":
            deltas.append(event.delta)
            engine.saw(event.delta)
        elif event.type == "response.completed":
            done = event.response
    assert done.output_text == "w0 w1 w2 w3 " and len(deltas) == 4
    assert engine.stats.unseen == 0  # each token reached the client before the engine sent the next
    with client.responses.stream(model="llama", input="hello there") as stream:
        for event in stream:
            if event.type == "response.output_text.delta":
                engine.saw(event.delta)
        assert stream.get_final_response().output_text == "w0 w1 w2 w3 "
    assert engine.stats.unseen == 0
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model="llama", input="and then?", previous_response_id="resp_1")
    assert "stores no responses" in refused.value.message
    records = wait_for(lambda: list(UsageRecord.objects.order_by("at")) if UsageRecord.objects.count() == 3 else None)
    assert [(r.endpoint, r.stream, r.completion_tokens) for r in records] == [
        ("responses", False, 4),
        ("responses", True, 4),
        ("responses", True, 4),
    ]


def test_a_client_hanging_up_through_llmgw_serve_cancels_the_engine_and_is_recorded(server, engines):
    engine = engines(tokens=100, token_delay_s=0.05)
    replica(model("llama"), engine.url)
    secret = key()
    body = {"model": "llama", "stream": True, "messages": [{"role": "user", "content": "a long story"}]}
    with httpx.stream(
        "POST", f"http://{server.gateway}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {secret}"}
    ) as answer:
        assert answer.status_code == 200
        for line in answer.iter_lines():
            if line.startswith("data:"):
                break
    wait_for(lambda: engine.stats.cancelled == 1)
    assert engine.stats.completed == 0
    record = wait_for(lambda: UsageRecord.objects.first())
    assert record.outcome == "client_disconnected" and 1 <= record.completion_tokens < 100


def test_a_budget_holds_under_fifty_concurrent_requests(server, engines):
    engine = engines(tokens=10, token_delay_s=0.02)
    replica(model("llama", price=(0, 1_000_000)), engine.url)  # a micro per completion token
    secret = key()
    Budget.objects.create(scope="team", team=ApiKey.objects.get().team, amount_micros=200, period="day")
    body = {"model": "llama", "stream": True, "max_tokens": 10, "messages": [{"role": "user", "content": "count"}]}

    async def one(client: httpx.AsyncClient) -> int:
        async with client.stream("POST", "/v1/chat/completions", json=body) as answer:
            await answer.aread()
            return answer.status_code

    async def fifty() -> list[int]:
        async with httpx.AsyncClient(
            base_url=f"http://{server.gateway}", headers={"Authorization": f"Bearer {secret}"}, timeout=30
        ) as client:
            return await asyncio.gather(*(one(client) for _ in range(50)))

    statuses = asyncio.run(fifty())
    assert statuses.count(200) == 20 and statuses.count(429) == 30
    wait_for(lambda: UsageRecord.objects.count() == 50)
    budget = Budget.objects.get()
    assert (budget.spent_micros, budget.reserved_micros) == (200, 0)
    refusal = httpx.post(
        f"http://{server.gateway}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {secret}"}
    ).json()["error"]
    assert refusal["code"] == "budget_exceeded" and "daily budget of team 'search' is spent" in refusal["message"]
    # Recorded before the test's tables are emptied: the server's write and the
    # teardown's TRUNCATE, at once, can deadlock.
    wait_for(lambda: UsageRecord.objects.count() == 51)


def test_a_revoked_key_stops_working_on_every_server_at_once(engines, tmp_path, django_user_model):
    env = {**server_env(), "LLMGW_REDIS_URL": REDIS_URL}
    replica(model("llama"), engines().url)
    secret = key()
    operator = people.operator("olivia")
    _, token = ApiToken.issue(operator, "test")
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    # One after the other: two first starts at once race to create the operator account.
    first = Server(tmp_path / "one", **env)
    second = None
    try:
        first.wait_ready()
        second = Server(tmp_path / "two", **env)
        second.wait_ready()
        body = {"model": "llama", "messages": [{"role": "user", "content": "hi"}]}
        auth = {"Authorization": f"Bearer {secret}"}
        for server in (first, second):
            assert (
                httpx.post(f"http://{server.gateway}/v1/chat/completions", json=body, headers=auth).status_code == 200
            )
        key_id = ApiKey.objects.get().id
        revoked = httpx.post(
            f"http://{first.admin}/api/v1/keys/{key_id}/revoke", headers={"Authorization": f"Bearer {token}"}
        )
        assert revoked.status_code == 200
        for server in (second, first):
            answer = httpx.post(f"http://{server.gateway}/v1/chat/completions", json=body, headers=auth)
            assert answer.status_code == 401 and "revoked" in answer.json()["error"]["message"]
    finally:
        first.stop()
        if second is not None:
            second.stop()


def gateway_processes(server: Server) -> set[int]:
    found = set()
    for pid in descendants(server.proc.pid):
        with contextlib.suppress(OSError):
            if b"llmgw.gateway_server" in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.add(pid)
    return found


def test_gateway_workers_share_the_listener_come_back_when_killed_and_write_usage_on_stop(engines, tmp_path):
    engine = engines()
    replica(model("llama"), engine.url)
    secret = key()
    server = Server(tmp_path, **server_env(), LLMGW_GATEWAY_WORKERS="2", LLMGW_GATEWAY_FLUSH_EVERY_S="30")
    body = {"model": "llama", "messages": [{"role": "user", "content": "hi"}]}
    auth = {"Authorization": f"Bearer {secret}"}
    url = f"http://{server.gateway}/v1/chat/completions"
    try:
        server.wait_ready()
        workers = wait_for(lambda: len(gateway_processes(server)) == 2 and gateway_processes(server))
        # The kernel hands each connection to one of them; both serve.
        assert all(httpx.post(url, json=body, headers=auth).status_code == 200 for _ in range(6))
        victim = min(workers)
        os.kill(victim, signal.SIGKILL)
        # (What the killed one still held is lost: at most one flush period, 50 ms by default.)
        killed_at = timezone.now()
        replaced = wait_for(lambda: len(gateway_processes(server) - {victim}) == 2 and gateway_processes(server))
        assert victim not in replaced
        assert httpx.post(url, json=body, headers=auth).status_code == 200
        assert "exited with -9; starting it again" in server.log.read_text()
        # Usage is written every 30 s here: what is queued is written when the server stops.
        answered = [httpx.post(url, json=body, headers=auth).status_code for _ in range(4)]
        assert answered == [200] * 4
    finally:
        pid = server.proc.pid
        assert server.stop() == 0, server.log.read_text()
    assert not descendants(pid), "no gateway process outlives llmgw serve"
    assert UsageRecord.objects.filter(at__gte=killed_at).count() == 5
    assert "Traceback" not in server.log.read_text(), server.log.read_text()


def test_a_gateway_worker_killed_mid_request_gives_its_reservation_back_within_its_lease(engines, tmp_path):
    engine = engines(tokens=400, token_delay_s=0.05)  # a 20 s answer
    replica(model("llama", price=(0, 1_000_000)), engine.url)  # a micro per completion token
    secret = key()
    budget = Budget.objects.create(scope="key", key=ApiKey.objects.get(), amount_micros=10_000, period="day")
    lease_s = 2.0
    # Beat's own reaper is left out of the way: this test drives it.
    server = Server(tmp_path, **server_env(), LLMGW_GATEWAY_LEASE_S=str(lease_s), LLMGW_EVERY_REAP_LEASES="3600")
    body = {"model": "llama", "stream": True, "max_tokens": 500, "messages": [{"role": "user", "content": "go"}]}
    try:
        server.wait_ready()
        (worker,) = wait_for(lambda: gateway_processes(server))
        with httpx.stream(
            "POST",
            f"http://{server.gateway}/v1/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {secret}"},
        ) as answer:
            assert answer.status_code == 200
            lines = answer.iter_lines()  # kept: a generator let go of closes the answer
            while not next(lines).startswith("data:"):
                pass
            budget.refresh_from_db()
            assert budget.reserved_micros >= 500
            # The request outlives its lease's length: the living worker's renewals keep it held.
            time.sleep(lease_s * 1.5)
            reap_leases()
            assert Budget.objects.get().reserved_micros == budget.reserved_micros
            os.kill(worker, signal.SIGKILL)
            killed = time.monotonic()
        # Held until the lease runs out (no renewal comes now), then the reaper gives it back.
        while Budget.objects.get().reserved_micros and time.monotonic() - killed < lease_s + 5:
            reap_leases()
            time.sleep(0.1)
        assert Budget.objects.get().reserved_micros == 0
        assert lease_s * 0.5 < time.monotonic() - killed <= lease_s + 1.5
        assert not Lease.objects.exclude(micros=0).exists()
        assert "reap_leases" in beat_schedule({})
    finally:
        server.stop()
