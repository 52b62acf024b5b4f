"""What of a client's body reaches an engine: the fields allowed for its protocol and kind of engine, nothing else.

Before, every field the gateway did not read went to the engine as it came:
``lora_path`` reached SGLang, which serves the adapter it names, so a key
allowed only the base model got the adapter at the base model's price; and
``input_ids`` (SGLang) or ``prompt_embeds`` (vLLM) would have been a prompt
the budget never saw. Checked at real HTTP stand-in engines, one of each kind.
"""

from __future__ import annotations

import asyncio
import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from catalog.models import Adapter
from gateway import fields
from gateway.models import UsageRecord
from gateway.writes import keys
from tests.gateway.harness import call, key, model, new_app, replica, settle

pytestmark = pytest.mark.django_db(transaction=True)

KINDS = ("vllm", "sglang", "llamacpp", "")
"""The engines llmgw runs, and a replica whose kind is not known (no profile)."""
NEVER = {
    # Pick a LoRA adapter past the key's allowed models and the adapter's price.
    "lora_path",
    "lora_request",
    "lora_name",
    "adapter",
    # A prompt the budget never saw.
    "input_ids",
    "prompt_embeds",
    # Code, templates or files on the engine's host; the engine's own scheduling and internals.
    "chat_template",
    "logits_processors",
    "custom_logit_processor",
    "mm_processor_kwargs",
    "vllm_xargs",
    "kv_transfer_params",
    "session_params",
    "bootstrap_host",
    "rid",
    "request_id",
    "priority",
    "return_hidden_states",
    "guided_decoding_backend",
    "extra_body",
}
"""Fields no engine is ever sent, whatever the protocol: named here, not read from gateway.fields."""
EXTRAS = [
    "top_k",
    "min_p",
    "repetition_penalty",
    "repeat_penalty",
    "regex",
    "ebnf",
    "guided_json",
    "guided_choice",
    "grammar",
    "mirostat_mode",
    "chat_template_kwargs",
    "ignore_eos",
    "min_tokens",
    "seed",
    "stop",
    "logprobs",
    "suffix",
    "echo",
    "dimensions",
    "encoding_format",
    "truncate_prompt_tokens",
    "thinking",
    "frequency_penalty",
    "response_format",
]
BASES = {
    "chat/completions": {"messages": [{"role": "user", "content": "say hello"}], "max_tokens": 3},
    "completions": {"prompt": "say hello", "max_tokens": 3},
    "embeddings": {"input": "say hello"},
    "messages": {"messages": [{"role": "user", "content": "say hello"}], "max_tokens": 3},
    "responses": {"input": "say hello", "max_output_tokens": 3},
}
# The fields each protocol's own checks read (gateway.shapes, anthropic.problem, responses.problem): a random
# value there is a 400 about that field, which is not what this test is about.
CHECKED = {
    "model",
    "messages",
    "prompt",
    "input",
    "max_tokens",
    "max_completion_tokens",
    "max_output_tokens",
    "n",
    "best_of",
    "stream",
    "stream_options",
    "metadata",
    "tools",
    "system",
    "instructions",
    "stop_sequences",
    "previous_response_id",
}
VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(0, 3), st.text(max_size=4)),
    lambda children: st.one_of(
        st.lists(children, max_size=2), st.dictionaries(st.text(max_size=6), children, max_size=2)
    ),
    max_leaves=4,
)
NAMES = st.one_of(st.sampled_from(sorted(NEVER) + EXTRAS), st.text(min_size=1, max_size=10)).filter(
    lambda name: name not in CHECKED
)
EXAMPLE = st.fixed_dictionaries({"extras": st.dictionaries(NAMES, VALUES, max_size=8), "stream": st.booleans()})


@pytest.fixture
def fleet(engines) -> dict:
    """One model per kind of engine, each with one ready replica on an engine of its own (vLLM's serves
    Anthropic's Messages itself, as vLLM does)."""
    out = {}
    for kind in KINDS:
        engine = engines(messages=kind == "vllm")
        m = model(f"on-{kind or 'unknown'}")
        replica(m, engine.url, engine=kind or None)
        out[kind] = (m.name, engine)
    return out


def names_an_adapter(name: str) -> bool:
    return name.lower().startswith("lora") or "adapter" in name.lower()


def run_each(requests: list[tuple[str, dict]], secret: str, engine_of) -> list[tuple]:
    """Each request in turn on one app: (answer, what its engine was sent and where, or None)."""

    async def go():
        app = new_app()
        out = []
        try:
            for endpoint, body in requests:
                engine = engine_of(body)
                before = engine.stats.requests
                answer = await call(app, f"/v1/{endpoint}", body, key=secret)
                sent = None
                if engine.stats.requests > before:
                    sent = (engine.stats.paths[-1].removeprefix("/v1/"), engine.stats.bodies[-1])
                out.append((answer, sent))
        finally:
            await settle(app)
        return out

    return asyncio.run(go())


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(example=EXAMPLE)
def test_whatever_a_body_holds_an_engine_is_sent_only_the_fields_allowed_for_its_protocol_and_kind(fleet, example):
    # The same extra fields, in each protocol, to each kind of engine.
    bodies = []
    for endpoint, kind in itertools.product(sorted(BASES), KINDS):
        body = {**example["extras"], **BASES[endpoint], "model": fleet[kind][0]}
        if example["stream"] and endpoint != "embeddings":
            body["stream"] = True
        bodies.append((endpoint, kind, body))
    by_model = {name: engine for name, engine in fleet.values()}

    answers = run_each([(e, b) for e, _, b in bodies], key(), lambda body: by_model[body["model"]])

    for (endpoint, kind, body), (answer, sent) in zip(bodies, answers, strict=True):
        picks_adapter = [name for name in body if names_an_adapter(name)]
        if picks_adapter:
            assert answer.status == 400 and sent is None, (picks_adapter, answer.status)
            assert picks_adapter[0] in answer.body.decode()
            continue
        if sent is None:
            assert 400 <= answer.status < 500, answer.body  # refused for a value its protocol checks
            continue
        path, received = sent
        assert not set(received) & NEVER, (endpoint, kind, sorted(set(received) & NEVER))
        assert set(received) <= fields.allowed(path, kind), (path, kind, set(received))
        if path == endpoint:
            # Nothing allowed is lost on the way: the client's own protocol, sent as it is.
            assert set(body) & fields.allowed(path, kind) <= set(received)


@pytest.fixture
def sglang_with_adapter(engines):
    """Model ``llama`` on SGLang with adapter ``llama-sql`` loaded; a key allowed only the base model."""
    engine = engines(name="llama")
    base = model("llama", price=(1_000_000, 1_000_000))
    Adapter.objects.create(model=base, name="llama-sql", source="hf://acme/llama-sql-lora")
    r = replica(base, engine.url, engine="sglang")
    r.adapters = ["llama-sql"]
    r.save(update_fields=["adapters"])
    return engine, keys.issue(team="search", org="acme", models=["llama"]).secret


@pytest.mark.parametrize(
    ("endpoint", "body"),
    [
        ("chat/completions", {"messages": [{"role": "user", "content": "hi"}], "lora_path": "llama-sql"}),
        ("completions", {"prompt": "hi", "lora_path": ["llama-sql"]}),
        ("messages", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "lora_path": "llama-sql"}),
        ("responses", {"input": "hi", "lora_request": {"lora_name": "llama-sql"}}),
    ],
)
def test_a_field_that_picks_an_adapter_is_refused_and_never_reaches_sglang(sglang_with_adapter, endpoint, body):
    engine, secret = sglang_with_adapter

    ((answer, sent),) = run_each([(endpoint, {**body, "model": "llama"})], secret, lambda _: engine)

    assert answer.status == 400 and sent is None
    error = answer.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert "picks a LoRA adapter" in error["message"] and "as the model" in error["message"], error
    if endpoint == "messages":
        assert answer.json()["type"] == "error"
    assert engine.stats.requests == 0 and not UsageRecord.objects.exists()


# (kind, endpoint, field, value, whether it reaches the engine): each engine's documented extras reach it, what it
# would take as a prompt, a template, code or an adapter does not, nor another engine's extras.
CASES = [
    ("vllm", "chat/completions", "top_k", 5, True),
    ("vllm", "chat/completions", "repetition_penalty", 1.1, True),
    ("vllm", "chat/completions", "guided_json", {"type": "object"}, True),
    ("vllm", "chat/completions", "regex", "a+", False),
    ("vllm", "chat/completions", "chat_template", "{{ messages }}", False),
    ("vllm", "chat/completions", "logits_processors", ["os.system"], False),
    ("vllm", "completions", "prompt_embeds", "AAAA", False),
    ("vllm", "completions", "min_p", 0.1, True),
    ("vllm", "embeddings", "truncate_prompt_tokens", 8, True),
    ("sglang", "chat/completions", "regex", "a+", True),
    ("sglang", "chat/completions", "input_ids", [1, 2, 3], False),
    ("sglang", "chat/completions", "custom_logit_processor", "x", False),
    ("sglang", "completions", "ebnf", 'root ::= "a"', True),
    ("sglang", "completions", "guided_json", {"type": "object"}, False),
    ("llamacpp", "chat/completions", "repeat_penalty", 1.1, True),
    ("llamacpp", "completions", "grammar", 'root ::= "a"', True),
    ("llamacpp", "chat/completions", "repetition_penalty", 1.1, False),
    ("", "chat/completions", "top_k", 5, False),
    ("", "chat/completions", "seed", 7, True),
    ("", "completions", "suffix", "!", True),
    ("", "embeddings", "dimensions", 3, True),
]


@pytest.mark.parametrize(("kind", "endpoint", "field", "value", "arrives"), CASES)
def test_each_engine_is_sent_its_own_extras_and_nothing_it_would_misuse(fleet, kind, endpoint, field, value, arrives):
    name, engine = fleet[kind]
    body = {**BASES[endpoint], "model": name, field: value, "temperature": 0.5}

    ((answer, sent),) = run_each([(endpoint, body)], key(), lambda _: engine)

    assert answer.status == 200, answer.body
    received = sent[1]
    assert (field in received) is arrives, (field, sorted(received))
    if arrives:
        assert received[field] == value
    if endpoint != "embeddings":
        assert received["temperature"] == 0.5  # OpenAI's own fields reach every engine


def test_chat_template_kwargs_reach_vllm_and_sglang_with_only_the_switches_they_document(fleet):
    kwargs = {"enable_thinking": False, "thinking": False, "chat_template": "{{ evil }}", "tokenize": True}
    for kind in ("vllm", "sglang", "llamacpp"):
        name, engine = fleet[kind]
        body = {**BASES["chat/completions"], "model": name, "chat_template_kwargs": kwargs}
        ((answer, (_, received)),) = run_each([("chat/completions", body)], key(), lambda _, e=engine: e)
        assert answer.status == 200
        if kind == "llamacpp":
            assert "chat_template_kwargs" not in received  # llama-cpp-python's server takes none
        else:
            assert received["chat_template_kwargs"] == {"enable_thinking": False, "thinking": False}


def test_vllm_is_sent_anthropics_fields_of_a_message_and_nothing_else(fleet):
    name, engine = fleet["vllm"]
    body = {
        **BASES["messages"],
        "model": name,
        "system": "be brief",
        "stop_sequences": ["\n"],
        "top_k": 5,
        "metadata": {"user_id": "u-1"},
        "input_ids": [1, 2],
        "chat_template": "{{ x }}",
        "frequency_penalty": 1.0,
    }

    ((answer, sent),) = run_each([("messages", body)], key(), lambda _: engine)

    assert answer.status == 200, answer.body
    path, received = sent
    assert path == "messages"
    assert set(received) == {"model", "messages", "max_tokens", "system", "stop_sequences", "top_k", "metadata"}
