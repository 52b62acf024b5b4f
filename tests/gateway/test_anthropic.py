"""gateway.anthropic: Messages to chat and back, plain and streamed, as properties."""

from __future__ import annotations

import itertools
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway import anthropic, shapes

text = st.text(min_size=1, max_size=12)
names = st.from_regex(r"[a-z][a-z_]{0,8}", fullmatch=True)
inputs = st.dictionaries(names, st.one_of(st.integers(), text, st.booleans()), max_size=3)
text_block = st.builds(lambda t: {"type": "text", "text": t}, text)
tool_use = st.builds(
    lambda i, n, x: {"type": "tool_use", "id": f"toolu_{i}", "name": n, "input": x}, names, names, inputs
)
tool_result = st.builds(
    lambda i, c: {"type": "tool_result", "tool_use_id": f"toolu_{i}", "content": c},
    names,
    st.one_of(text, st.lists(text_block, min_size=1, max_size=2)),
)
user = st.builds(
    lambda c: {"role": "user", "content": c},
    st.one_of(text, st.lists(st.one_of(text_block, tool_result), min_size=1, max_size=3)),
)
assistant = st.builds(
    lambda c: {"role": "assistant", "content": c},
    st.one_of(text, st.lists(st.one_of(text_block, tool_use), min_size=1, max_size=3)),
)
requests = st.fixed_dictionaries(
    {
        "model": st.just("llama"),
        "max_tokens": st.integers(1, 4096),
        "messages": st.lists(st.one_of(user, assistant), min_size=1, max_size=4),
    },
    optional={
        "system": st.one_of(text, st.lists(text_block, min_size=1, max_size=2)),
        "stop_sequences": st.lists(text, max_size=2),
        "temperature": st.floats(0, 1),
        "stream": st.booleans(),
        "tools": st.lists(
            st.builds(lambda n: {"name": n, "description": "d", "input_schema": {"type": "object"}}, names),
            max_size=2,
        ),
        "tool_choice": st.sampled_from(
            [{"type": "auto"}, {"type": "any"}, {"type": "none"}, {"type": "tool", "name": "f"}]
        ),
    },
)


def texts_of_messages(body: dict) -> list[str]:
    """Every text of a Messages request, in order (tool results' too)."""
    out = []
    system = body.get("system")
    if system:
        out.append(system if isinstance(system, str) else "".join(b["text"] for b in system))
    for message in body["messages"]:
        content = message["content"]
        if isinstance(content, str):
            out.append(content)
            continue
        for block in content:
            if block["type"] == "text":
                out.append(block["text"])
            elif block["type"] == "tool_result":
                inner = block["content"]
                out.append(inner if isinstance(inner, str) else "".join(b["text"] for b in inner))
    return out


def texts_of_chat(chat: dict) -> list[str]:
    out = []
    for message in chat["messages"]:
        content = message.get("content")
        if isinstance(content, str):
            out.append(content)
        elif isinstance(content, list):
            out.extend(p["text"] for p in content)
    return out


@settings(max_examples=300, deadline=None)
@given(requests)
def test_every_messages_request_becomes_a_chat_request_the_gateway_serves_with_the_same_text_and_tools(body):
    assert shapes.problem("messages", body) is None
    chat = anthropic.to_chat(body)
    assert shapes.problem("chat/completions", chat) is None
    assert chat["max_tokens"] == body["max_tokens"]
    # Text, in order: user blocks kept apart as parts, an assistant's joined, tool results as tool messages.
    assert "".join(texts_of_chat(chat)) == "".join(texts_of_messages(body))
    if body.get("system"):
        assert chat["messages"][0]["role"] == "system"
    uses = [
        b for m in body["messages"] if isinstance(m["content"], list) for b in m["content"] if b["type"] == "tool_use"
    ]
    calls = [c for m in chat["messages"] for c in m.get("tool_calls") or []]
    assert [(c["id"], c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        (u["id"], u["name"], u["input"]) for u in uses
    ]
    results = [
        b["tool_use_id"]
        for m in body["messages"]
        if isinstance(m["content"], list)
        for b in m["content"]
        if b["type"] == "tool_result"
    ]
    assert [m["tool_call_id"] for m in chat["messages"] if m["role"] == "tool"] == results
    assert chat.get("stop", []) == (body.get("stop_sequences") or [])
    assert [t["function"]["name"] for t in chat.get("tools", [])] == [t["name"] for t in body.get("tools", [])]


def test_tool_choice_and_the_system_blocks_translate():
    body = {
        "model": "m",
        "max_tokens": 5,
        "system": [{"type": "text", "text": "be brief"}],
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"name": "f", "input_schema": {"type": "object"}}],
        "tool_choice": {"type": "tool", "name": "f", "disable_parallel_tool_use": True},
        "metadata": {"user_id": "u1"},
    }
    chat = anthropic.to_chat(body)
    assert chat["messages"][0] == {"role": "system", "content": "be brief"}
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "f"}}
    assert chat["parallel_tool_calls"] is False and chat["user"] == "u1"
    assert anthropic.to_chat({**body, "tool_choice": {"type": "any"}})["tool_choice"] == "required"


def test_a_bad_messages_body_is_refused_with_a_sentence_naming_the_field():
    good = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}
    cases = {
        "max_tokens is required": {k: v for k, v in good.items() if k != "max_tokens"},
        "messages must be a non-empty list": {**good, "messages": []},
        "messages[0].role must be 'user' or 'assistant'": {**good, "messages": [{"role": "system", "content": "x"}]},
        "messages[0].content[0] is an image block": {**good, "messages": [{"role": "user", "content": [image]}]},
        "system[0] must be a text block": {**good, "system": [image]},
        "max_tokens must be a whole number": {**good, "max_tokens": "5"},
        "has type 'wat'": {**good, "messages": [{"role": "user", "content": [{"type": "wat"}]}]},
        "tool_choice must be": {**good, "tool_choice": "auto"},
    }
    for sentence, body in cases.items():
        assert sentence in (shapes.problem("messages", body) or ""), body


finishes = st.sampled_from(["stop", "length", "tool_calls", "content_filter", None])
calls = st.lists(st.tuples(names, inputs), max_size=2)


def chat_answer(content, tool_calls, finish, matched, usage):
    message = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = [
            {"id": f"call_{i}", "type": "function", "function": {"name": n, "arguments": json.dumps(x)}}
            for i, (n, x) in enumerate(tool_calls)
        ]
    choice = {"index": 0, "message": message, "finish_reason": finish, "stop_reason": matched}
    return {"id": "chat-1", "choices": [choice], "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1]}}


def test_every_stop_reason():
    stops = ["END"]
    assert anthropic.stop_reason("stop", None, stops) == ("end_turn", None)
    assert anthropic.stop_reason("stop", "END", stops) == ("stop_sequence", "END")
    assert anthropic.stop_reason("stop", "OTHER", stops) == ("end_turn", None)
    assert anthropic.stop_reason("stop", 2, stops) == ("end_turn", None)  # vLLM's EOS token id
    assert anthropic.stop_reason("length", None, stops) == ("max_tokens", None)
    assert anthropic.stop_reason("tool_calls", None, stops) == ("tool_use", None)
    assert anthropic.stop_reason("content_filter", None, stops) == ("refusal", None)


def chunks_of(answer: dict, pieces: list[int]) -> list[bytes]:
    """A chat answer as the SSE stream an engine sends for it, text cut at ``pieces``, with a usage chunk."""
    choice = answer["choices"][0]
    message = choice["message"]
    events = [{"choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}]}]
    content = message.get("content") or ""
    cuts = sorted({p % (len(content) + 1) for p in pieces} | {0, len(content)})
    for a, b in itertools.pairwise(cuts):
        events.append({"choices": [{"index": 0, "delta": {"content": content[a:b]}, "finish_reason": None}]})
    for i, call in enumerate(message.get("tool_calls") or []):
        arguments = call["function"]["arguments"]
        half = len(arguments) // 2
        first = {"index": i, "id": call["id"], "type": "function", "function": {"name": call["function"]["name"]}}
        first["function"]["arguments"] = arguments[:half]
        events.append({"choices": [{"index": 0, "delta": {"tool_calls": [first]}}]})
        rest = {"index": i, "function": {"arguments": arguments[half:]}}
        events.append({"choices": [{"index": 0, "delta": {"tool_calls": [rest]}}]})
    last = {"index": 0, "delta": {}, "finish_reason": choice["finish_reason"], "stop_reason": choice["stop_reason"]}
    events.append({"choices": [last]})
    events.append({"choices": [], "usage": answer["usage"]})
    return [b"data: " + json.dumps(e).encode() + b"\n\n" for e in events] + [b"data: [DONE]\n\n"]


def accumulate(raw: bytes) -> dict:
    """What a client makes of a Messages stream (as the anthropic SDK accumulates one)."""
    message = None
    kinds = []
    partial: dict[int, str] = {}
    for part in raw.decode().split("\n\n"):
        if not part.strip():
            continue
        name_line, data_line = part.split("\n")
        name, data = name_line.removeprefix("event: "), json.loads(data_line.removeprefix("data: "))
        assert data["type"] == name
        kinds.append(name)
        if name == "message_start":
            message = data["message"]
        elif name == "content_block_start":
            assert data["index"] == len(message["content"])
            message["content"].append(dict(data["content_block"]))
        elif name == "content_block_delta":
            block, delta = message["content"][data["index"]], data["delta"]
            if delta["type"] == "text_delta":
                block["text"] += delta["text"]
            else:
                partial[data["index"]] = partial.get(data["index"], "") + delta["partial_json"]
        elif name == "content_block_stop":
            if data["index"] in partial:
                message["content"][data["index"]]["input"] = json.loads(partial[data["index"]])
        elif name == "message_delta":
            message.update(data["delta"])
            message["usage"].update(data["usage"])
    assert kinds[:2] == ["message_start", "ping"] and kinds[-2:] == ["message_delta", "message_stop"]
    return message


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(st.none(), text),
    calls,
    finishes,
    st.sampled_from([None, "END", "x"]),
    st.tuples(st.integers(0, 99), st.integers(0, 99)),
    st.lists(st.integers(0, 40), max_size=4),
    st.lists(st.integers(1, 60), max_size=6),
)
def test_a_streamed_chat_answer_translates_to_the_same_message_as_the_plain_one(
    content, tool_calls, finish, matched, usage, pieces, byte_cuts
):
    answer = chat_answer(content, tool_calls, finish, matched, usage)
    plain = anthropic.from_chat(answer, "llama", ["END"])
    raw = b"".join(chunks_of(answer, pieces))
    # The engine's bytes arrive cut anywhere, not on event boundaries.
    stream = anthropic.ChatStream("llama", ["END"])
    out = bytearray()
    at = 0
    for cut in [*byte_cuts, len(raw)]:
        out += stream.feed(raw[at : at + cut])
        at += cut
    out += stream.feed(raw[at:]) + stream.tail()
    streamed = accumulate(bytes(out))
    assert stream.usage == usage
    assert {k: v for k, v in streamed.items() if k != "id"} == {k: v for k, v in plain.items() if k != "id"}
    reason = plain["stop_reason"]
    if tool_calls and finish == "tool_calls":
        assert reason == "tool_use"
    assert reason in {"end_turn", "max_tokens", "stop_sequence", "tool_use", "refusal"}
    assert [b["input"] for b in plain["content"] if b["type"] == "tool_use"] == [x for _, x in tool_calls]


def test_a_stream_is_translated_as_it_arrives_not_at_its_end():
    stream = anthropic.ChatStream("llama")
    first = stream.feed(b'data: {"choices":[{"index":0,"delta":{"content":"Hel"}}]}\n\n')
    assert b"message_start" in first and b'"text": "Hel"' in first and b"message_stop" not in first
    assert stream.feed(b'data: {"choices":[{"index":0,"delta":{"content":"lo"}}]}\n') == b""  # half an event
    assert b'"text": "lo"' in stream.feed(b"\n")


def test_a_native_stream_passes_untouched_and_its_usage_is_read():
    events = [
        anthropic.event("message_start", {"type": "message_start", "message": {"usage": {"input_tokens": 9}}}),
        anthropic.event("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {}}),
        anthropic.event("message_delta", {"type": "message_delta", "delta": {}, "usage": {"output_tokens": 3}}),
    ]
    raw = b"".join(events)
    meter = anthropic.NativeStream()
    out = meter.feed(raw[:17]) + meter.feed(raw[17:]) + meter.tail()
    assert out == raw and meter.usage == (9, 3) and meter.text_chunks == 1


def test_errors_in_anthropics_shape():
    assert json.loads(anthropic.error_body(429, "slow down")) == {
        "type": "error",
        "error": {"type": "rate_limit_error", "message": "slow down"},
    }
    refused = json.loads(anthropic.engine_error(400, b'{"error": {"message": "context too long"}}'))
    assert refused["error"] == {
        "type": "invalid_request_error",
        "message": "the engine refused the request: context too long",
    }
    assert anthropic.serves_messages("vllm")
    assert not any(anthropic.serves_messages(e) for e in ("llamacpp", "sglang", None))  # llama-cpp-python: chat only
