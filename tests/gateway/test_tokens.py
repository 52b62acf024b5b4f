"""Reading streams as they pass: events whole, usage found, the added usage chunk kept back."""

from __future__ import annotations

import asyncio
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway import tokens, upstream
from gateway.tokens import StreamMeter, completion_bound, count_prompt, estimate, prompt_of, usage_of


def event(obj) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def text_chunk(text: str) -> dict:
    return {"choices": [{"index": 0, "delta": {"content": text}}]}


USAGE = {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11}}


def test_events_split_across_reads_are_passed_on_whole_and_in_order():
    stream = event(text_chunk("a")) + event(text_chunk("b")) + b"data: [DONE]\n\n"
    meter = StreamMeter()
    out = b""
    for i in range(0, len(stream), 7):
        out += meter.feed(stream[i : i + 7])
    out += meter.tail()
    assert out == stream
    assert meter.text_chunks == 2 and meter.usage is None


def test_nothing_is_held_back_once_an_event_is_complete():
    meter = StreamMeter()
    first = event(text_chunk("a"))
    assert meter.feed(first + b'data: {"cho') == first


def test_the_usage_chunk_llmgw_asked_for_is_kept_back_and_read():
    meter = StreamMeter(drop_usage_chunk=True)
    out = meter.feed(event(text_chunk("a")) + event(USAGE) + b"data: [DONE]\n\n")
    assert b"usage" not in out and out.endswith(b"data: [DONE]\n\n")
    assert meter.usage == (9, 2)


def test_the_usage_chunk_the_client_asked_for_is_passed_on():
    meter = StreamMeter(drop_usage_chunk=False)
    assert b'"usage"' in meter.feed(event(USAGE))


def test_crlf_separated_events_and_llamacpp_timings():
    meter = StreamMeter()
    last = {**text_chunk("z"), "timings": {"prompt_n": 12, "predicted_n": 30}}
    stream = b"data: " + json.dumps(last).encode() + b"\r\n\r\n"
    assert meter.feed(stream) == stream
    assert meter.usage == (12, 30)


def test_usage_and_prompt_text_helpers():
    assert usage_of({"usage": {"prompt_tokens": 3}}) == (3, 0)
    assert usage_of({"usage": None}) is None
    assert estimate("abcdefghi") == 3  # a guess at an answer's tokens, for records only
    assert (
        prompt_of({"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]}).joined == "a\nb"
    )
    assert prompt_of({"input": ["x", "y"]}).joined == "x\ny"


def bound(body: dict) -> int:
    return prompt_of(body).bound()


FLOOR = tokens.PER_REQUEST_TOKENS


def test_prompts_sent_as_token_ids_are_counted_one_each():
    assert bound({"prompt": list(range(1000))}) >= 1000
    assert bound({"prompt": [list(range(300)), list(range(200))]}) >= 500
    assert prompt_of({"prompt": [[1, 2], [3]]}).sequences == 2


def test_embedding_inputs_as_lists_of_text_or_ids_are_counted():
    assert bound({"input": ["x" * 400, "y" * 400]}) >= 800
    assert bound({"input": [[7] * 500, [8] * 500]}) >= 1000


def test_tool_definitions_are_counted():
    tool = {"type": "function", "function": {"name": "lookup", "description": "d" * 2000, "parameters": {}}}
    without = bound({"messages": [{"role": "user", "content": "hi"}]})
    assert bound({"messages": [{"role": "user", "content": "hi"}], "tools": [tool]}) >= without + 2000


def test_images_and_audio_count_a_fixed_conservative_cost_and_their_data_nothing_more():
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 100}}
    audio = {"type": "input_audio", "input_audio": {"data": "B" * 100, "format": "wav"}}
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "what is this"}, image, audio]}]}
    prompt = prompt_of(body)
    assert prompt.non_text == 2 and prompt.bound() >= 2 * tokens.NON_TEXT_TOKENS
    assert "A" * 100 not in prompt.joined and "what is this" in prompt.joined


def test_cjk_text_is_bounded_by_its_bytes_not_a_quarter_of_its_characters():
    text = "预算不能被超出" * 100  # 700 characters; a tokenizer may well make 700 tokens of them
    assert bound({"messages": [{"role": "user", "content": text}]}) >= 3 * 700


def test_tool_calls_and_every_other_string_of_a_message_are_counted():
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{" + "x" * 500 + "}"}}
    body = {"messages": [{"role": "assistant", "content": None, "tool_calls": [call]}]}
    assert bound(body) >= 500


@given(
    texts=st.lists(st.text(max_size=40), max_size=5),
    ids=st.lists(st.integers(min_value=0, max_value=200_000), max_size=50),
)
def test_the_bound_is_never_below_the_bytes_or_ids_sent(texts, ids):
    # Every tokenizer engines use makes a token of one byte at least.
    messages = [{"role": "user", "content": t} for t in texts]
    assert bound({"messages": messages}) >= sum(len(t.encode()) for t in texts) + FLOOR
    assert bound({"prompt": ids}) >= len(ids) + FLOOR


def test_completions_are_bounded_by_max_tokens_for_every_choice_of_every_prompt():
    one = prompt_of({"prompt": "a"})
    assert completion_bound({"max_tokens": 10}, one, "completions", 1024) == 10
    assert completion_bound({}, one, "completions", 1024) == 1024
    assert completion_bound({"max_tokens": 10, "n": 3}, one, "completions", 1024) == 30
    assert completion_bound({"max_tokens": 10, "n": 2, "best_of": 5}, one, "completions", 1024) == 50
    assert completion_bound({"max_completion_tokens": 7, "max_tokens": 99}, one, "chat/completions", 1) == 7
    # A completion knows only max_tokens: what every engine's /v1/completions reads.
    assert completion_bound({"max_completion_tokens": 7, "max_tokens": 99}, one, "completions", 1) == 99
    four = prompt_of({"prompt": ["a", "b", "c", "d"]})
    assert completion_bound({"max_tokens": 10}, four, "completions", 1024) == 40
    assert completion_bound({"max_tokens": True, "n": -1}, one, "completions", 5) == 5
    assert completion_bound({"max_tokens": 10}, one, "embeddings", 1024) == 0


def tokenized(engine_url: str, body: dict) -> int:
    async def go():
        client = upstream.Client(connect_timeout_s=1.0, read_timeout_s=2.0)
        try:
            return await count_prompt(client, engine_url, "m", prompt_of(body))
        finally:
            await client.aclose()

    return asyncio.run(go())


@pytest.mark.parametrize("style", ["vllm", "llamacpp"])
def test_the_engines_tokenizer_counts_the_text_and_ids_and_images_are_added(engines, style):
    engine = engines(tokenize=style)
    image = {"type": "image_url", "image_url": {"url": "http://x/y.png"}}
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "one two three"}, image]}]}
    # The fake tokenizer makes a token of each word.
    assert tokenized(engine.url, body) == 3 + tokens.NON_TEXT_TOKENS
    assert tokenized(engine.url, {"prompt": [1, 2, 3]}) == 3  # ids need no tokenizer


@pytest.mark.parametrize("style", ["none", "broken"])
def test_without_a_working_tokenizer_the_prompt_is_counted_by_its_bound(engines, style):
    engine = engines(tokenize=style)
    body = {"messages": [{"role": "user", "content": "一二三四"}]}
    assert tokenized(engine.url, body) == bound(body)
    assert tokenized("http://127.0.0.1:1", body) == bound(body)
