"""``POST /v1/messages`` in-process: translated for a chat-only engine, passed through to a native one.

Through the same admission, routing and usage as chat; every refusal in
Anthropic's error shape.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from gateway.models import ApiKey, Budget, UsageRecord
from tests.gateway.harness import call, key, model, new_app, replica, settle

pytestmark = pytest.mark.django_db(transaction=True)

MESSAGES = "/v1/messages"


def ask(name: str = "llama", **extra) -> dict:
    return {
        "model": name,
        "max_tokens": 100,
        "system": "you are terse",
        "messages": [{"role": "user", "content": "say hello to everyone"}],
        **extra,
    }


def run(scenario):
    async def go():
        app = new_app()
        try:
            return await scenario(app)
        finally:
            await settle(app)

    return asyncio.run(go())


def events(answer) -> list[tuple[str, dict]]:
    out = []
    for part in answer.body.decode().split("\n\n"):
        if part.strip():
            name, data = part.split("\n")
            out.append((name.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return out


def test_a_message_to_a_chat_only_engine_is_translated_both_ways_and_recorded(engines):
    engine = engines(tokens=4)
    replica(model("llama", price=(1_000_000, 2_000_000)), engine.url)  # no profile: chat only
    secret = key()

    answer = run(lambda app: call(app, MESSAGES, ask(), headers={"x-api-key": secret}))

    assert answer.status == 200, answer.body
    message = answer.json()
    assert message["type"] == "message" and message["role"] == "assistant"
    assert message["content"] == [{"type": "text", "text": "w0 w1 w2 w3"}]
    assert (message["stop_reason"], message["stop_sequence"]) == ("end_turn", None)
    assert message["usage"] == {"input_tokens": 7, "output_tokens": 4}
    (sent,) = engine.stats.bodies
    assert sent["messages"][0] == {"role": "system", "content": "you are terse"} and sent["max_tokens"] == 100
    record = UsageRecord.objects.get()
    assert (record.endpoint, record.prompt_tokens, record.completion_tokens, record.counted_by) == (
        "messages",
        7,
        4,
        "engine",
    )
    assert record.cost_micros == 7 + 4 * 2 and record.status == 200


def test_a_streamed_message_is_translated_event_by_event_as_the_engine_sends(engines):
    engine = engines(tokens=3, lockstep=True)
    replica(model("llama"), engine.url)
    secret = key()

    answer = run(lambda app: call(app, MESSAGES, ask(stream=True), key=secret, on_body=engine.saw))

    assert answer.status == 200 and answer.headers["content-type"].startswith("text/event-stream")
    got = events(answer)
    assert [n for n, _ in got] == [
        "message_start",
        "ping",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert "".join(d["delta"]["text"] for n, d in got if n == "content_block_delta") == "w0 w1 w2 "
    assert got[-2][1]["usage"] == {"input_tokens": 7, "output_tokens": 3}
    assert got[-2][1]["delta"]["stop_reason"] == "end_turn"
    # Passed on as each token came: the client saw each before the engine sent the next.
    assert engine.stats.unseen == 0
    assert engine.stats.bodies[0]["stream_options"] == {"include_usage": True}
    record = UsageRecord.objects.get()
    assert (record.endpoint, record.stream, record.prompt_tokens, record.completion_tokens) == ("messages", True, 7, 3)


def test_tool_use_and_max_tokens_translate(engines):
    tools = [{"name": "lookup", "description": "find", "input_schema": {"type": "object"}}]
    replica(model("tooly"), engines(tool_call="lookup").url)
    replica(model("short"), engines(tokens=8, honour_max_tokens=True).url)
    secret = key()
    history = [
        {"role": "user", "content": "look it up"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "call_1", "name": "lookup", "input": {"q": "a"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1", "content": "found"}]},
    ]

    async def scenario(app):
        plain = await call(app, MESSAGES, ask("tooly", tools=tools, messages=history), key=secret)
        streamed = await call(app, MESSAGES, ask("tooly", tools=tools, stream=True), key=secret)
        cut = await call(app, MESSAGES, ask("short", max_tokens=3), key=secret)
        return plain, streamed, cut

    plain, streamed, cut = run(scenario)
    message = plain.json()
    assert message["content"] == [{"type": "tool_use", "id": "call_fake", "name": "lookup", "input": {"q": "w0"}}]
    assert message["stop_reason"] == "tool_use"
    got = events(streamed)
    start = next(d for n, d in got if n == "content_block_start")
    assert start["content_block"] == {"type": "tool_use", "id": "call_fake", "name": "lookup", "input": {}}
    partial = "".join(d["delta"]["partial_json"] for n, d in got if n == "content_block_delta")
    assert json.loads(partial) == {"q": "w0"}
    assert next(d for n, d in got if n == "message_delta")["delta"]["stop_reason"] == "tool_use"
    assert (cut.json()["stop_reason"], cut.json()["content"][0]["text"]) == ("max_tokens", "w0 w1 w2")


def test_a_native_engine_is_sent_the_message_untouched_plain_and_streamed(engines):
    engine = engines(tokens=3, messages=True)
    replica(model("llama", aliases=["claude-ish"]), engine.url, engine="vllm")
    secret = key()
    body = ask("claude-ish", metadata={"user_id": "u1"})

    async def scenario(app):
        return await call(app, MESSAGES, body, key=secret), await call(
            app, MESSAGES, {**body, "stream": True}, key=secret
        )

    plain, streamed = run(scenario)
    assert plain.status == 200 and plain.json()["id"] == "msg_fake"
    assert plain.json()["usage"] == {"input_tokens": 7, "output_tokens": 3}
    # The client's own body, with the catalog's model name: not a chat request.
    assert engine.stats.bodies[0] == {**body, "model": "llama"}
    assert next(n for n, _ in events(streamed)) == "message_start" and streamed.body.endswith(
        b'data: {"type": "message_stop"}\n\n'
    )
    records = list(UsageRecord.objects.order_by("at"))
    assert [(r.endpoint, r.stream, r.prompt_tokens, r.completion_tokens) for r in records] == [
        ("messages", False, 7, 3),
        ("messages", True, 7, 3),
    ]


def anthropic_error(answer, status: int, kind: str) -> str:
    assert answer.status == status, answer.body
    body = answer.json()
    assert body["type"] == "error" and body["error"]["type"] == kind, body
    return body["error"]["message"]


def test_every_refusal_is_in_anthropics_error_shape(engines):
    engine = engines()
    replica(model("llama", price=(1_000_000, 1_000_000)), engine.url)
    replica(model("other"), engine.url)
    secret = key(models=["llama"])
    limited = key(team="limited")
    ApiKey.objects.filter(team__name="limited").update(rpm=1)
    broke = key(team="broke")
    Budget.objects.create(scope="key", key=ApiKey.objects.get(team__name="broke"), amount_micros=1, period="day")
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}

    async def scenario(app):
        return [
            await call(app, MESSAGES, ask(), headers={"x-api-key": "sk-llmgw-wrong"}),
            await call(app, MESSAGES, ask("other"), key=secret),
            await call(app, MESSAGES, ask("nope"), key=secret),
            await call(app, MESSAGES, ask(messages=[{"role": "user", "content": [image]}]), key=secret),
            await call(app, MESSAGES, {"model": "llama", "messages": [{"role": "user", "content": "x"}]}, key=secret),
            await call(app, MESSAGES, ask(), key=broke),
            await call(app, MESSAGES, ask("other"), key=limited),
            await call(app, MESSAGES, ask("other"), key=limited),
        ]

    wrong, disallowed, unknown, picture, no_max, budget, first, second = run(scenario)
    assert "not known" in anthropic_error(wrong, 401, "authentication_error")
    assert "may not use model 'other'" in anthropic_error(disallowed, 403, "permission_error")
    assert "no model named 'nope'" in anthropic_error(unknown, 404, "not_found_error")
    assert "image block" in anthropic_error(picture, 400, "invalid_request_error")
    assert "max_tokens is required" in anthropic_error(no_max, 400, "invalid_request_error")
    assert "budget" in anthropic_error(budget, 429, "rate_limit_error")
    assert first.status == 200
    assert "per minute" in anthropic_error(second, 429, "rate_limit_error")
    assert engine.stats.requests == 1  # only the one admitted reached an engine
    outcomes = sorted(UsageRecord.objects.values_list("outcome", flat=True))
    assert outcomes == sorted(["model_not_allowed", "budget_exceeded", "ok", "rate_limit_exceeded"])


def test_a_native_kind_of_engine_that_does_not_serve_messages_is_translated_for(engines):
    engine = engines(tokens=2)  # a vLLM before 0.11: /v1/messages is 404 there
    replica(model("llama"), engine.url, engine="vllm")
    secret = key()

    answer = run(lambda app: call(app, MESSAGES, ask(), key=secret))

    assert answer.status == 200 and answer.json()["content"] == [{"type": "text", "text": "w0 w1"}]
    # Asked natively first (404), then sent the chat request.
    native, chat = engine.stats.bodies
    assert "system" in native and chat["messages"][0]["role"] == "system"
    assert UsageRecord.objects.get().status == 200
