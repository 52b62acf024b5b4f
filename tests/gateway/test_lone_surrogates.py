"""A lone surrogate anywhere in a ``/v1`` body is a 400 in the protocol's error shape, whoever sends it.

JSON may spell half of a UTF-16 pair (``"\\ud800"``), and Python's reader
takes it; such text is not Unicode, cannot be encoded as UTF-8, and no
engine, database or log can hold it. It was a 500 on every endpoint, before
the key was even checked. Now the body is refused as it is read: with a good
key, a wrong one or none, nothing is reserved, recorded or sent to an engine.
"""

from __future__ import annotations

import asyncio
import copy
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.models import UsageRecord
from tests.gateway.harness import call, key, model, new_app, replica, settle

pytestmark = pytest.mark.django_db(transaction=True)

VALID = {
    "/v1/chat/completions": {
        "model": "llama",
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        ],
        "max_tokens": 4,
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
    },
    "/v1/completions": {"model": "llama", "prompt": ["say", "hello"], "max_tokens": 4, "stop": ["\n"]},
    "/v1/embeddings": {"model": "llama", "input": ["one", "two"]},
    "/v1/messages": {
        "model": "llama",
        "max_tokens": 4,
        "system": [{"type": "text", "text": "be brief"}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        "metadata": {"user_id": "u-1"},
    },
    "/v1/responses": {"model": "llama", "input": [{"role": "user", "content": "hi"}], "instructions": "be brief"},
}
SURROGATE = st.sampled_from(["\ud800", "\udfff", "a\udc80b", "\ud83d", "x\ud800\ud800"])
PLAIN = st.text(alphabet=st.characters(codec="utf-8"), max_size=6)
TEXT = st.one_of(PLAIN, SURROGATE)
ANY_JSON = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-5, 5), TEXT),
    lambda children: st.one_of(st.lists(children, max_size=3), st.dictionaries(TEXT, children, max_size=3)),
    max_leaves=6,
)


def containers(value, out: list) -> list:
    """Every object and list in ``value``, outermost first."""
    if isinstance(value, dict):
        out.append(value)
        for child in value.values():
            containers(child, out)
    elif isinstance(value, list):
        out.append(value)
        for child in value:
            containers(child, out)
    return out


@st.composite
def hostile_bodies(draw) -> tuple[str, bytes]:
    """A valid body of one endpoint with a lone surrogate put in at any depth: a key, a value, or under either."""
    path = draw(st.sampled_from(sorted(VALID)))
    body = copy.deepcopy(VALID[path])
    target = draw(st.sampled_from(containers(body, [])))
    bad = draw(SURROGATE)
    how = draw(st.sampled_from(["key", "value", "beneath", "replace"]))
    if how == "replace":
        # A string already there (the model's name, a message's text) gets the surrogate.
        strings = [(c, k) for c in containers(body, []) for k in (c if isinstance(c, dict) else range(len(c)))]
        strings = [(c, k) for c, k in strings if isinstance(c[k], str)]
        where, name = draw(st.sampled_from(strings))
        where[name] = draw(PLAIN) + bad + draw(PLAIN)
    else:
        value = {"k": draw(ANY_JSON), bad: draw(ANY_JSON)} if how == "beneath" else bad
        if isinstance(target, dict):
            name = bad if how == "key" else draw(PLAIN.filter(lambda k: k not in target))
            target[name] = draw(ANY_JSON) if how == "key" else value
        else:
            target.insert(draw(st.integers(0, len(target))), {bad: draw(ANY_JSON)} if how == "key" else value)
    return path, json.dumps(body).encode()  # ensure_ascii: the surrogate travels as its \\u escape


def refused_in_its_shape(path: str, answer) -> str:
    assert answer.status == 400, (path, answer.status, answer.body)
    body = answer.json()
    if path == "/v1/messages":
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
        return body["error"]["message"]
    assert body["error"]["type"] == "invalid_request_error" and body["error"]["code"] == "invalid_json"
    return body["error"]["message"]


@pytest.fixture
def llama(engines):
    engine = engines()
    replica(model("llama", price=(1_000_000, 1_000_000)), engine.url)
    return engine


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cases=st.lists(hostile_bodies(), min_size=1, max_size=4))
def test_a_lone_surrogate_anywhere_is_a_400_in_the_protocols_shape_with_any_key_or_none(llama, cases):
    secret = key()

    async def go():
        app = new_app()
        try:
            return [
                (path, await call(app, path, raw, key=who))
                for path, raw in cases
                for who in (secret, "sk-not-a-key", None)
            ]
        finally:
            await settle(app)

    for path, answer in asyncio.run(go()):
        words = refused_in_its_shape(path, answer)
        assert "lone surrogate" in words and words.encode("utf-8")
    assert llama.stats.requests == 0
    assert not UsageRecord.objects.exists()


def chat(raw: bytes):
    """One chat request with a good key, on an app of its own."""
    secret = key()

    async def go():
        app = new_app()
        try:
            return await call(app, "/v1/chat/completions", raw, key=secret)
        finally:
            await settle(app)

    return asyncio.run(go())


def test_the_refusal_names_where_the_surrogate_is(llama):
    answer = chat(b'{"model": "llama", "messages": [{"role": "user", "content": "hi \\ud800"}]}')
    words = refused_in_its_shape("/v1/chat/completions", answer)
    assert "body.messages[0].content" in words, words


def test_a_surrogate_pair_is_text_and_is_served(llama):
    answer = chat(b'{"model": "llama", "messages": [{"role": "user", "content": "hi \\ud83d\\ude00"}]}')
    assert answer.status == 200
    assert llama.stats.bodies[0]["messages"][0]["content"] == "hi \U0001f600"
