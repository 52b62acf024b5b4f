"""Which fields of a client's body go on to an engine: a list per protocol and kind of engine, not a deny-list.

The gateway checks what it reads (the model, the prompt, the limits) and,
before this, sent everything else as it came. But engines act on fields the
gateway never looks at: SGLang serves the LoRA adapter ``lora_path`` names
(so a key allowed only the base model got the adapter, at the base's price)
and takes ``input_ids`` as the prompt, past the one the budget was reserved
for; vLLM reads ``prompt_embeds``, a client's own ``chat_template`` and
``logits_processors`` naming code on its host. A list of what is refused is
always one release behind the engines, so what is sent is a list instead:

- each protocol's own fields, as OpenAI (or Anthropic) defines them, to every
  engine: what a client written for that API sends;
- each engine's documented extras that only shape sampling or the output's
  format (``top_k``, ``min_p``, a grammar, a JSON schema), to that engine
  only, read from its request schema (vLLM's ``protocol.py``, SGLang's
  ``openai/protocol.py``, llama-cpp-python's ``server/types.py``);
- inside ``chat_template_kwargs`` and ``stream_options``, only the switches
  named in ``NESTED``.

Anything else is dropped without a word, as OpenAI-compatible servers ignore
fields they do not know: the official clients send ``extra_body`` at the top
level, and a client that adds a field for another engine still gets its answer.
A field that picks an adapter is refused instead (:func:`adapter_problem`): its
sender expects the adapter, and quietly serving the base would answer as another
model than the one asked for.

Messages (vLLM serves it natively) gets Anthropic's fields. Responses and a
Messages request for any other engine are translated into a chat request
(gateway.responses, gateway.anthropic), itself built from a list, and then sent
what chat is. Pure: no Django, no I/O.
"""

from __future__ import annotations

from typing import Any

OPENAI = {
    "chat/completions": frozenset(
        {
            "model",
            "messages",
            "frequency_penalty",
            "presence_penalty",
            "logit_bias",
            "logprobs",
            "top_logprobs",
            "max_tokens",
            "max_completion_tokens",
            "n",
            "response_format",
            "seed",
            "stop",
            "stream",
            "stream_options",
            "temperature",
            "top_p",
            "tools",
            "tool_choice",
            "parallel_tool_calls",
            "functions",
            "function_call",
            "reasoning_effort",
            "user",
        }
    ),
    "completions": frozenset(
        {
            "model",
            "prompt",
            "best_of",
            "echo",
            "frequency_penalty",
            "presence_penalty",
            "logit_bias",
            "logprobs",
            "max_tokens",
            "n",
            "seed",
            "stop",
            "stream",
            "stream_options",
            "suffix",
            "temperature",
            "top_p",
            "user",
        }
    ),
    "embeddings": frozenset({"model", "input", "dimensions", "encoding_format", "user"}),
    # Anthropic's Messages, as vLLM's /v1/messages takes it.
    "messages": frozenset(
        {
            "model",
            "messages",
            "max_tokens",
            "metadata",
            "stop_sequences",
            "stream",
            "system",
            "temperature",
            "thinking",
            "tool_choice",
            "tools",
            "top_k",
            "top_p",
        }
    ),
    # Never sent as it is today (translated into chat); listed so that an engine serving it natively one day
    # is sent these, the fields gateway.responses reads, and no more.
    "responses": frozenset(
        {
            "model",
            "input",
            "instructions",
            "max_output_tokens",
            "parallel_tool_calls",
            "stream",
            "temperature",
            "tool_choice",
            "tools",
            "top_p",
            "user",
        }
    ),
}
"""Each protocol's own fields, sent to an engine of any kind (one the directory knows no kind of included)."""

_SAMPLING = {"top_k", "min_p", "min_tokens", "stop_token_ids", "ignore_eos", "skip_special_tokens"}
"""Extras vLLM's and SGLang's chat and completions both read, each only a bound or a sampling knob."""
_VLLM = _SAMPLING | {
    "repetition_penalty",
    "include_stop_str_in_output",
    "spaces_between_special_tokens",
    "truncate_prompt_tokens",
    "prompt_logprobs",
    "allowed_token_ids",
    "bad_words",
    "add_special_tokens",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "guided_whitespace_pattern",
    "structured_outputs",
    "return_tokens_as_token_ids",
}
_SGLANG = _SAMPLING | {"repetition_penalty", "regex", "ebnf", "stop_regex", "no_stop_trim"}
# llama-cpp-python's server (what llmgw runs for llama.cpp): its own knobs and a GBNF grammar.
_LLAMACPP = frozenset(
    {
        "top_k",
        "min_p",
        "min_tokens",
        "repeat_penalty",
        "mirostat_mode",
        "mirostat_tau",
        "mirostat_eta",
        "grammar",
        "logit_bias_type",
    }
)
# What a chat template reads: the conversation's shape and the template's own switches.
_TEMPLATE = {"echo", "add_generation_prompt", "continue_final_message", "documents", "chat_template_kwargs"}

EXTRAS: dict[tuple[str, str], frozenset[str]] = {
    ("chat/completions", "vllm"): frozenset(_VLLM | _TEMPLATE | {"structural_tag"}),
    ("completions", "vllm"): frozenset(_VLLM | {"response_format"}),
    ("embeddings", "vllm"): frozenset({"truncate_prompt_tokens", "add_special_tokens"}),
    ("chat/completions", "sglang"): frozenset(
        _SGLANG | {"continue_final_message", "separate_reasoning", "stream_reasoning", "chat_template_kwargs"}
    ),
    ("completions", "sglang"): frozenset(_SGLANG | {"json_schema", "response_format"}),
    ("chat/completions", "llamacpp"): _LLAMACPP,
    ("completions", "llamacpp"): _LLAMACPP,
}
"""Each engine's documented extras, per endpoint. Left out on purpose, though the engine reads them:
adapters (``lora_path``, ``lora_request``), prompts the budget never sees (``input_ids``, ``prompt_embeds``),
templates and code (``chat_template``, ``logits_processors``, ``custom_logit_processor``,
``mm_processor_kwargs``), the engine's own scheduling and plumbing (``priority``, ``request_id``, ``rid``,
``session_params``, ``kv_transfer_params``, ``vllm_xargs``, ``bootstrap_*``, ``guided_decoding_backend``),
and what costs work that is not billed (``use_beam_search``, ``return_hidden_states``)."""

NESTED = {
    "chat_template_kwargs": frozenset({"enable_thinking", "thinking"}),
    "stream_options": frozenset({"include_usage", "continuous_usage_stats"}),
}
"""The keys kept inside these objects: a chat template's thinking switch (Qwen3's and DeepSeek's names), never
a template of the client's own; and what a stream reports."""


def allowed(endpoint: str, engine: str) -> frozenset[str]:
    """The top-level fields an engine of kind ``engine`` is sent on ``endpoint`` (its path after ``/v1/``).

    An engine of a kind not listed (a replica without a profile) is sent
    its protocol's own fields only.
    """
    return OPENAI.get(endpoint, frozenset()) | EXTRAS.get((endpoint, engine), frozenset())


def forwarded(body: dict[str, Any], endpoint: str, engine: str) -> dict[str, Any]:
    """``body`` with only what :func:`allowed` lets through, and only ``NESTED``'s keys inside those objects."""
    keep = allowed(endpoint, engine)
    out: dict[str, Any] = {}
    for name, value in body.items():
        if name not in keep:
            continue
        inner = NESTED.get(name)
        out[name] = {k: v for k, v in value.items() if k in inner} if inner and isinstance(value, dict) else value
    return out


def adapter_problem(body: dict[str, Any]) -> str | None:
    """A sentence refusing a field that picks a LoRA adapter (SGLang's ``lora_path``, …), or None.

    Any field named ``lora…`` or holding ``adapter``: broader than today's
    engines, so that the next one's spelling is refused too.
    """
    for name in body:
        if isinstance(name, str) and (name.lower().startswith("lora") or "adapter" in name.lower()):
            return (
                f"{name} picks a LoRA adapter, which this gateway never takes from a body field (the key's allowed "
                "models and the adapter's price would not apply): ask for the adapter by its name as the model, "
                "{'model': 'ADAPTER', …}"
            )
    return None
