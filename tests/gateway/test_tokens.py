"""Reading streams as they pass: events whole, usage found, the added usage chunk kept back."""

from __future__ import annotations

import json

from gateway.tokens import StreamMeter, estimate, prompt_text, usage_of


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
    assert estimate("abcdefghi") == 3
    assert prompt_text({"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]}) == "a\nb"
    assert prompt_text({"input": ["x", "y"]}) == "x\ny"
