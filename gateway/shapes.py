"""The shape a ``/v1`` body must have before the gateway reserves anything for it.

The gateway reads a body's messages, prompt and limits to estimate its cost
and to pick a replica; a body whose ``messages`` is a number, whose content
part's ``text`` is a list, or whose ``max_tokens`` is 10**30 is one no engine
would serve. Refusing it here, with the field's path, means such a request
costs nothing and never reaches the code that estimates or routes it.

Only what the gateway itself reads, and what every OpenAI-compatible engine
would refuse anyway, is checked: an unknown field or an unknown content part
type passes through to the engine untouched (engines grow faster than this
file). Pure: no Django, no I/O.
"""

from __future__ import annotations

from typing import Any

from gateway import anthropic, responses

# The counts a request may ask for, each bounded so that limit × price stays far inside the
# budget columns (64-bit micros) however the estimate multiplies them.
INT32_MAX = 2**31 - 1
COUNTS = {"max_tokens": INT32_MAX, "max_completion_tokens": INT32_MAX, "n": 128, "best_of": 128}
TEXT_PARTS = {"text": "text", "refusal": "refusal", "input_text": "text", "output_text": "text"}
# A media part's URL is fetched by the engine: an http(s) URL over the network, a data: URL from the
# body. Any other (file://, a bare path) the engine would read from its node's own disk, which vLLM does
# under --allowed-local-media-path (agent/launch_rules.py keeps that directory narrow; this keeps it shut).
MEDIA_URL_SCHEMES = ("http", "https", "data")


def problem(endpoint: str, body: dict[str, Any]) -> str | None:
    """A sentence saying what is wrong with ``body`` for ``endpoint``, or None when the gateway can serve it."""
    checks = {
        "chat/completions": _chat,
        "completions": _completions,
        "embeddings": _embeddings,
        "messages": anthropic.problem,
        "responses": responses.problem,
    }
    for check in (_common, checks.get(endpoint)):
        found = check(body) if check else None
        if found:
            return found
    return None


def _common(body: dict[str, Any]) -> str | None:
    for name, top in COUNTS.items():
        value = body.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            return f"{name} must be a whole number, not {_kind(value)}"
        if not 0 <= value <= top:
            return f"{name} must be between 0 and {top:,}; it is {_clip(value)}"
    if body.get("stream") is not None and not isinstance(body["stream"], bool):
        return f"stream must be true or false, not {_kind(body['stream'])}"
    for name in ("stream_options", "metadata"):
        if body.get(name) is not None and not isinstance(body[name], dict):
            return f"{name} must be an object, not {_kind(body[name])}"
    if body.get("tools") is not None:
        tools = body["tools"]
        if not isinstance(tools, list):
            return f"tools must be a list, not {_kind(tools)}"
        for i, tool in enumerate(tools):
            if not isinstance(tool, dict):
                return f"tools[{i}] must be an object, not {_kind(tool)}"
    return None


def _chat(body: dict[str, Any]) -> str | None:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "messages must be a non-empty list of {'role': …, 'content': …} objects"
    for i, message in enumerate(messages):
        found = _message(message, f"messages[{i}]")
        if found:
            return found
    return None


def _message(message: Any, where: str) -> str | None:
    if not isinstance(message, dict):
        return f"{where} must be an object with a role and content, not {_kind(message)}"
    if not isinstance(message.get("role"), str) or not message["role"]:
        return f"{where}.role must be text such as 'user' or 'system'"
    for name in ("name", "tool_call_id"):
        if message.get(name) is not None and not isinstance(message[name], str):
            return f"{where}.{name} must be text, not {_kind(message[name])}"
    content = message.get("content")
    if content is None or isinstance(content, str):
        pass
    elif isinstance(content, list):
        for j, part in enumerate(content):
            found = _part(part, f"{where}.content[{j}]")
            if found:
                return found
    else:
        return f"{where}.content must be text or a list of content parts, not {_kind(content)}"
    calls = message.get("tool_calls")
    if calls is not None and not (isinstance(calls, list) and all(isinstance(c, dict) for c in calls)):
        return f"{where}.tool_calls must be a list of objects"
    return None


def _part(part: Any, where: str) -> str | None:
    if not isinstance(part, dict):
        return f"{where} must be an object such as {{'type': 'text', 'text': …}}, not {_kind(part)}"
    kind = part.get("type")
    if not isinstance(kind, str) or not kind:
        return f"{where}.type must be text such as 'text' or 'image_url'"
    field = TEXT_PARTS.get(kind)
    if field and not isinstance(part.get(field), str):
        return f"{where}.{field} must be text, not {_kind(part.get(field))}"
    if kind.endswith("_url"):
        return _media_url(part.get(kind), f"{where}.{kind}")
    return None


def _media_url(value: Any, where: str) -> str | None:
    """Why a media part's URL (``{"url": …}`` or the URL itself) may not reach the engine, or None."""
    url = value.get("url") if isinstance(value, dict) else value
    if not isinstance(url, str):
        return None  # no URL: the engine refuses the part itself
    scheme, colon, _ = url.partition(":")
    if colon and scheme.lower() in MEDIA_URL_SCHEMES:  # " http:" too is refused: not every parser strips it
        return None
    return (
        f"{where} must be an http(s) or data: URL, not {url[:40]!r}: the engine would read any other from its own node"
    )


def _completions(body: dict[str, Any]) -> str | None:
    return _prompt_like(body.get("prompt"), "prompt", empty_ok=True)


def _embeddings(body: dict[str, Any]) -> str | None:
    return _prompt_like(body.get("input"), "input", empty_ok=False)


def _prompt_like(value: Any, name: str, *, empty_ok: bool) -> str | None:
    """Text, a list of texts, a list of token ids, or a list of lists of token ids, as OpenAI takes them."""
    if isinstance(value, str):
        return None
    if not isinstance(value, list) or (not value and not empty_ok):
        return f"{name} must be text, a list of texts, or token ids; it is {_kind(value)}"
    for i, item in enumerate(value):
        if isinstance(item, str) or _token_id(item):
            continue
        if isinstance(item, list) and item and all(_token_id(t) for t in item):
            continue
        return f"{name}[{i}] must be text, a token id or a list of token ids, not {_kind(item)}"
    kinds = {isinstance(item, str) for item in value}
    if len(kinds) > 1:
        return f"{name} mixes texts and token ids; send one or the other"
    return None


def _token_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= INT32_MAX


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true or false"
    return {str: "text", int: "a number", float: "a number", list: "a list", dict: "an object"}.get(
        type(value), type(value).__name__
    )


def _clip(value: int) -> str:
    text = str(value)
    return text if len(text) <= 24 else f"a number of {len(text)} digits"
