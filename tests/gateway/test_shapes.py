"""What the gateway refuses before it reserves anything (gateway/shapes.py), and that what it accepts
is a body its estimate and its router can read whatever the values."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway import router, shapes, tokens

ENDPOINTS = ["chat/completions", "completions", "embeddings"]
leaves = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
)
anything = st.recursive(
    leaves,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
part = st.fixed_dictionaries(
    {"type": st.sampled_from(["text", "image_url", "refusal"]) | anything},
    optional={"text": st.text(max_size=20) | anything, "image_url": anything, "refusal": anything},
)
message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "assistant", "tool"]) | anything},
    optional={
        "content": st.text(max_size=40) | st.lists(part | anything, max_size=3) | anything,
        "name": anything,
        "tool_calls": anything,
        "tool_call_id": anything,
    },
)
prompt = st.text(max_size=40) | st.lists(st.text(max_size=10) | st.integers(-5, 2**40) | anything, max_size=4)
body = st.fixed_dictionaries(
    {"model": st.just("m")},
    optional={
        "messages": st.lists(message | anything, max_size=4) | anything,
        "prompt": prompt | anything,
        "input": prompt | anything,
        **{name: st.integers(-(2**70), 2**70) | anything for name in shapes.COUNTS},
        "stream": st.booleans() | anything,
        "stream_options": anything,
        "tools": st.lists(anything, max_size=2) | anything,
    },
)


@settings(max_examples=400)
@given(st.sampled_from(ENDPOINTS), body)
def test_a_body_is_refused_with_a_sentence_or_can_be_estimated_and_routed(endpoint, request_body):
    wrong = shapes.problem(endpoint, request_body)
    if wrong is not None:
        assert isinstance(wrong, str) and len(wrong) > 10
        return
    found = tokens.prompt_of(request_body)
    limit = tokens.completion_bound(request_body, found, endpoint, 1024)
    assert found.bound() >= 0 and 0 <= limit <= 2**31 * 128 * max(found.sequences, 1)
    router.prompt_prefix(request_body, 256)


@pytest.mark.parametrize(
    ("endpoint", "request_body", "words"),
    [
        ("chat/completions", {"messages": 3}, "messages must be a non-empty list"),
        ("chat/completions", {"messages": []}, "messages must be a non-empty list"),
        ("chat/completions", {"messages": [None]}, "messages[0] must be an object"),
        ("chat/completions", {"messages": [{"content": "hi"}]}, "messages[0].role must be text"),
        ("chat/completions", {"messages": [{"role": "user", "content": 5}]}, "messages[0].content must be text"),
        (
            "chat/completions",
            {"messages": [{"role": "user", "content": [{"type": "text", "text": ["x"]}]}]},
            "messages[0].content[0].text must be text, not a list",
        ),
        (
            "chat/completions",
            {"messages": [{"role": "user", "content": [{"type": ["text"]}]}]},
            "messages[0].content[0].type must be text",
        ),
        ("chat/completions", {"messages": [{"role": "u"}], "max_tokens": 10**30}, "a number of 31 digits"),
        ("chat/completions", {"messages": [{"role": "u"}], "max_tokens": True}, "max_tokens must be a whole number"),
        ("chat/completions", {"messages": [{"role": "u"}], "n": 1000}, "n must be between 0 and 128"),
        ("chat/completions", {"messages": [{"role": "u"}], "stream": "yes"}, "stream must be true or false"),
        ("completions", {}, "prompt must be text"),
        ("completions", {"prompt": [1, "a"]}, "mixes texts and token ids"),
        ("completions", {"prompt": [[1, -2]]}, "prompt[0] must be text, a token id"),
        ("embeddings", {"input": []}, "input must be text"),
        ("embeddings", {"input": [{"a": 1}]}, "input[0] must be text"),
    ],
)
def test_what_no_engine_would_serve_is_named_by_its_path(endpoint, request_body, words):
    assert words in (shapes.problem(endpoint, {"model": "m", **request_body}) or "")


@pytest.mark.parametrize(
    ("endpoint", "request_body"),
    [
        ("chat/completions", {"messages": [{"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]}]}),
        ("chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}),
        ("chat/completions", {"messages": [{"role": "user", "content": "x"}], "vendor_extension": [1]}),
        ("completions", {"prompt": [[1, 2, 3], [4]]}),
        ("completions", {"prompt": ["a", "b"], "max_tokens": 0}),
        ("embeddings", {"input": "text"}),
    ],
)
def test_what_real_clients_send_passes(endpoint, request_body):
    assert shapes.problem(endpoint, {"model": "m", **request_body}) is None


def _media(kind: str, url: str, nested: bool) -> dict:
    part = {"type": kind, kind: {"url": url} if nested else url}
    return {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "x"}, part]}]}


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(["image_url", "video_url", "audio_url"]),
    st.one_of(
        st.sampled_from(["file", "FILE", " file", "ftp", "gopher", "s3", "hf", "jar", "local"]),
        st.from_regex(r"[A-Za-z][A-Za-z0-9+.-]{0,8}", fullmatch=True),
    ),
    st.sampled_from(["///etc/passwd", "/etc/shadow", "//host/share", "data/x.png"]),
    st.booleans(),
)
def test_a_media_url_the_engine_would_read_from_its_own_disk_is_refused(kind, scheme, rest, nested):
    """vLLM reads file:// media under --allowed-local-media-path; only http(s) and data: URLs are passed on."""
    found = shapes.problem("chat/completions", _media(kind, f"{scheme}:{rest}", nested))
    if scheme.lower() in ("http", "https", "data"):
        assert found is None
    else:
        assert found is not None and found.startswith(f"messages[0].content[1].{kind}")
    assert shapes.problem("chat/completions", _media(kind, "/etc/passwd", nested)) is not None


@pytest.mark.parametrize("url", ["https://example.com/cat.png", "http://10.0.0.5/x.jpg", "data:image/png;base64,AAAA"])
def test_media_by_http_or_data_url_passes(url):
    assert shapes.problem("chat/completions", _media("image_url", url, True)) is None
