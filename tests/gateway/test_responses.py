"""``POST /v1/responses``: the stateless subset of OpenAI's Responses, served as chat (gateway.responses)."""

from __future__ import annotations

import asyncio
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway import responses, shapes
from gateway.models import ApiKey, Budget, UsageRecord
from tests.gateway.harness import call, key, model, new_app, replica, settle
from tests.gateway.test_anthropic import chat_answer, chunks_of, names

RESPONSES = "/v1/responses"


def accumulate(raw: bytes) -> tuple[dict, list[str]]:
    """The last event's Response, checked against what the deltas before it built."""
    kinds, texts, arguments, final = [], {}, {}, None
    for part in raw.decode().split("\n\n"):
        if not part.strip():
            continue
        name, data = part.split("\n")
        name, data = name.removeprefix("event: "), json.loads(data.removeprefix("data: "))
        assert data["type"] == name and data["sequence_number"] == len(kinds)
        kinds.append(name)
        if name == "response.output_text.delta":
            texts[data["output_index"]] = texts.get(data["output_index"], "") + data["delta"]
        elif name == "response.function_call_arguments.delta":
            arguments[data["output_index"]] = arguments.get(data["output_index"], "") + data["delta"]
        elif name in ("response.completed", "response.incomplete"):
            final = data["response"]
    for i, item in enumerate(final["output"]):
        if item["type"] == "message":
            assert item["content"][0]["text"] == texts[i]
        else:
            assert item["arguments"] == arguments.get(i, "")
    return final, kinds


def comparable(response: dict) -> dict:
    out = {k: v for k, v in response.items() if k not in ("id", "created_at")}
    out["output"] = [{k: v for k, v in item.items() if k != "id"} for item in response["output"]]
    return out


@settings(max_examples=200, deadline=None)
@given(
    st.one_of(st.none(), st.text(min_size=1, max_size=12)),
    st.lists(st.tuples(names, st.dictionaries(names, st.integers(), max_size=2)), max_size=2),
    st.sampled_from(["stop", "length", "tool_calls", None]),
    st.tuples(st.integers(0, 99), st.integers(0, 99)),
    st.lists(st.integers(0, 40), max_size=4),
    st.lists(st.integers(1, 60), max_size=6),
)
def test_a_streamed_chat_answer_makes_the_same_response_as_the_plain_one(
    content, tool_calls, finish, usage, pieces, cuts
):
    answer = chat_answer(content, tool_calls, finish, None, usage)
    plain = responses.from_chat(answer, "llama", {})
    raw = b"".join(chunks_of(answer, pieces))
    stream = responses.ChatStream("llama", {})
    out, at = bytearray(), 0
    for cut in [*cuts, len(raw)]:
        out += stream.feed(raw[at : at + cut])
        at += cut
    out += stream.tail()
    streamed, kinds = accumulate(bytes(out))
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert comparable(streamed) == comparable(plain)
    assert plain["status"] == ("incomplete" if finish == "length" else "completed")
    assert plain["usage"]["input_tokens"] == usage[0] and plain["usage"]["output_tokens"] == usage[1]


def test_the_stateless_subset_becomes_chat_and_the_rest_is_refused_with_a_sentence():
    body = {
        "model": "m",
        "instructions": "be brief",
        "max_output_tokens": 20,
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "weather?"}]},
            {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": '{"city": "Oslo"}'},
            {"type": "function_call_output", "call_id": "c1", "output": "rain"},
        ],
        "tools": [{"type": "function", "name": "weather", "parameters": {"type": "object"}}],
        "tool_choice": "auto",
    }
    assert shapes.problem("responses", body) is None
    chat = responses.to_chat(body)
    assert shapes.problem("chat/completions", chat) is None
    assert chat["max_tokens"] == 20 and chat["tool_choice"] == "auto"
    assert [m["role"] for m in chat["messages"]] == ["system", "user", "assistant", "tool"]
    assert chat["messages"][2]["tool_calls"][0]["function"] == {"name": "weather", "arguments": '{"city": "Oslo"}'}
    assert chat["tools"] == [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]
    assert responses.to_chat({"model": "m", "input": "hi"})["messages"] == [{"role": "user", "content": "hi"}]
    refused = {
        "this gateway stores no responses": {"model": "m", "input": "hi", "previous_response_id": "resp_1"},
        "built-in tools are not served": {"model": "m", "input": "hi", "tools": [{"type": "web_search"}]},
        "other inputs are not served": {
            "model": "m",
            "input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}],
        },
        "input must be text or a non-empty list": {"model": "m", "input": []},
        "max_output_tokens must be a whole number": {"model": "m", "input": "hi", "max_output_tokens": 0},
    }
    for sentence, wrong in refused.items():
        assert sentence in (shapes.problem("responses", wrong) or ""), wrong


def run(scenario):
    async def go():
        app = new_app()
        try:
            return await scenario(app)
        finally:
            await settle(app)

    return asyncio.run(go())


@pytest.mark.django_db(transaction=True)
def test_a_response_is_served_as_chat_plain_and_streamed_and_recorded(engines):
    engine = engines(tokens=3)
    replica(model("llama"), engine.url, engine="vllm")
    secret = key()
    body = {"model": "llama", "instructions": "be brief", "input": "say hello", "max_output_tokens": 50}

    async def scenario(app):
        plain = await call(app, RESPONSES, body, key=secret)
        streamed = await call(app, RESPONSES, {**body, "stream": True}, key=secret)
        refused = await call(app, RESPONSES, {**body, "previous_response_id": "resp_1"}, key=secret)
        return plain, streamed, refused

    plain, streamed, refused = run(scenario)
    assert plain.status == 200, plain.body
    response = plain.json()
    assert response["object"] == "response" and response["status"] == "completed"
    assert response["output"][0]["content"][0]["text"] == "w0 w1 w2"
    assert (response["usage"]["input_tokens"], response["usage"]["output_tokens"]) == (4, 3)
    final, kinds = accumulate(streamed.body)
    assert kinds[-1] == "response.completed" and final["output"][0]["content"][0]["text"] == "w0 w1 w2 "
    assert refused.status == 400 and "stores no responses" in refused.json()["error"]["message"]
    assert engine.stats.bodies[0]["messages"][0] == {"role": "system", "content": "be brief"}
    records = list(UsageRecord.objects.order_by("at"))
    assert [(r.endpoint, r.stream, r.prompt_tokens, r.completion_tokens) for r in records] == [
        ("responses", False, 4, 3),
        ("responses", True, 4, 3),
    ]


@pytest.mark.django_db(transaction=True)
def test_a_budget_a_disallowed_model_and_a_rate_limit_answer_responses_in_openais_shape(engines):
    engine = engines()
    replica(model("llama", price=(1_000_000, 1_000_000)), engine.url)
    replica(model("other"), engine.url)
    only_llama = key(models=["llama"])
    broke = key(team="broke")
    Budget.objects.create(scope="key", key=ApiKey.objects.get(team__name="broke"), amount_micros=1, period="day")
    limited = key(team="limited")
    ApiKey.objects.filter(team__name="limited").update(rpm=1)
    body = {"input": "hi", "max_output_tokens": 10}

    async def scenario(app):
        return [
            await call(app, RESPONSES, {**body, "model": "other"}, key=only_llama),
            await call(app, RESPONSES, {**body, "model": "llama"}, key=broke),
            await call(app, RESPONSES, {**body, "model": "other"}, key=limited),
            await call(app, RESPONSES, {**body, "model": "other"}, key=limited),
        ]

    disallowed, budget, first, second = run(scenario)
    assert (disallowed.status, disallowed.json()["error"]["code"]) == (403, "model_not_allowed")
    assert (budget.status, budget.json()["error"]["code"]) == (429, "budget_exceeded")
    assert first.status == 200
    assert (second.status, second.json()["error"]["code"]) == (429, "rate_limit_exceeded")
    assert engine.stats.requests == 1
