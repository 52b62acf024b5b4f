"""Anthropic's Messages API (``POST /v1/messages``) in terms of OpenAI's chat completions, both ways.

An engine that serves ``/v1/messages`` itself (``serves_messages``: vLLM
since 0.11) is sent the client's body untouched but
for the model's name; any other is sent the chat completion this module
makes of it (``to_chat``), and its answer is turned back into a Message
(``from_chat``), or, streamed, into Anthropic's events as each chat chunk
arrives (``ChatStream``). Either way the gateway reads the token counts as
it relays (``usage_of`` and ``NativeStream`` for native answers).

What the translation covers: the system prompt, text blocks, tool use and
tool results, tools and tool_choice, stop sequences, the sampling fields
chat has too, and the stop reasons end_turn, max_tokens, stop_sequence and
tool_use. An image or document block is refused with a sentence (400)
rather than dropped, as is any block type this module does not know.
Pure: no Django, no I/O.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from gateway import sse
from gateway.errors import engine_message

NATIVE_ENGINES = frozenset({"vllm"})
"""Engines (catalog profile ``engine``) whose server answers ``/v1/messages`` itself: vLLM since 0.11.

Not ``llamacpp``: llama.cpp's own C++ server answers it, but llmgw's
llamacpp engine is llama-cpp-python's server (agent/supervisor/llamacpp.py),
which has chat, completions and embeddings only. An engine named here that
answers 404 (a vLLM before 0.11) is sent the chat request instead
(gateway.proxy).
"""
ROLES = ("user", "assistant")
UNSUPPORTED_BLOCKS = {"image", "document", "search_result", "container_upload"}
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "function_call": "tool_use"}
STOP_REASONS["content_filter"] = "refusal"
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}


def serves_messages(engine: str | None) -> bool:
    """Whether an engine of this kind answers ``/v1/messages`` natively (else it is translated for)."""
    return engine in NATIVE_ENGINES


def error_body(status: int, message: str) -> bytes:
    """Anthropic's error shape: ``{"type": "error", "error": {"type", "message"}}``."""
    kind = ERROR_TYPES.get(status, "api_error")
    return json.dumps({"type": "error", "error": {"type": kind, "message": message}}).encode()


# --- the request's shape ------------------------------------------------------


def problem(body: dict[str, Any]) -> str | None:
    """A sentence saying what is wrong with a Messages body, or None (what gateway.shapes does for chat)."""
    tokens = body.get("max_tokens")
    if tokens is None:
        return "max_tokens is required by the Messages API: send {'max_tokens': N, …}"
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "messages must be a non-empty list of {'role': 'user' or 'assistant', 'content': …} objects"
    system = body.get("system")
    if system is not None and not isinstance(system, str):
        found = _blocks(system, "system", text_only=True)
        if found:
            return found
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            return f"{where} must be an object with a role and content, not {_kind(message)}"
        if message.get("role") not in ROLES:
            return f"{where}.role must be 'user' or 'assistant' (the system prompt goes in 'system')"
        content = message.get("content")
        if not isinstance(content, str):
            found = _blocks(content, f"{where}.content", text_only=False)
            if found:
                return found
    for name in ("stop_sequences",):
        value = body.get(name)
        if value is not None and not (isinstance(value, list) and all(isinstance(s, str) for s in value)):
            return f"{name} must be a list of texts"
    tools = body.get("tools")
    if isinstance(tools, list):
        for i, tool in enumerate(tools):
            if isinstance(tool, dict) and not isinstance(tool.get("name"), str):
                return f"tools[{i}].name must be text"
    choice = body.get("tool_choice")
    if choice is not None and not (isinstance(choice, dict) and choice.get("type") in ("auto", "any", "tool", "none")):
        return "tool_choice must be {'type': 'auto'}, {'type': 'any'}, {'type': 'none'} or {'type': 'tool', 'name': …}"
    return None


def _blocks(content: Any, where: str, *, text_only: bool) -> str | None:
    if not isinstance(content, list):
        return f"{where} must be text or a list of content blocks, not {_kind(content)}"
    for j, block in enumerate(content):
        at = f"{where}[{j}]"
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            return f"{at} must be a content block such as {{'type': 'text', 'text': …}}"
        kind = block["type"]
        if kind == "text":
            if not isinstance(block.get("text"), str):
                return f"{at}.text must be text, not {_kind(block.get('text'))}"
        elif text_only:
            return f"{at} must be a text block; {where} takes text only"
        elif kind == "tool_use":
            if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str):
                return f"{at} (tool_use) needs an id and a name, both text"
            if not isinstance(block.get("input", {}), dict):
                return f"{at}.input must be an object"
        elif kind == "tool_result":
            if not isinstance(block.get("tool_use_id"), str):
                return f"{at}.tool_use_id must be text"
            inner = block.get("content")
            if inner is not None and not isinstance(inner, str):
                found = _blocks(inner, f"{at}.content", text_only=True)
                if found:
                    return found
        elif kind in ("thinking", "redacted_thinking"):
            continue
        elif kind in UNSUPPORTED_BLOCKS:
            return f"{at} is an {kind} block, which this gateway does not take on /v1/messages: send text"
        else:
            return f"{at} has type {kind!r}, which /v1/messages here does not know: send text, tool_use or tool_result"
    return None


# --- Messages request → chat request -------------------------------------------


def to_chat(body: dict[str, Any]) -> dict[str, Any]:
    """The chat completion request that asks what ``body`` (a Messages request ``problem`` passed) asks."""
    messages: list[dict[str, Any]] = []
    system = body.get("system")
    if system:
        messages.append({"role": "system", "content": system if isinstance(system, str) else _text_of(system)})
    for message in body["messages"]:
        messages.extend(_chat_messages(message["role"], message["content"]))
    chat: dict[str, Any] = {"model": body.get("model"), "messages": messages, "max_tokens": body["max_tokens"]}
    for name in ("temperature", "top_p", "top_k", "stream"):
        if body.get(name) is not None:
            chat[name] = body[name]
    if body.get("stop_sequences"):
        chat["stop"] = list(body["stop_sequences"])
    metadata = body.get("metadata")
    if isinstance(metadata, dict) and isinstance(metadata.get("user_id"), str):
        chat["user"] = metadata["user_id"]
    tools = [t for t in body.get("tools") or [] if isinstance(t, dict)]
    if tools:
        chat["tools"] = [_chat_tool(t) for t in tools]
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        kind = choice.get("type")
        if kind == "tool":
            chat["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
        else:
            chat["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}[kind]
        if choice.get("disable_parallel_tool_use") and tools:
            chat["parallel_tool_calls"] = False
    return chat


def _chat_tool(tool: dict[str, Any]) -> dict[str, Any]:
    function: dict[str, Any] = {"name": tool["name"]}
    if isinstance(tool.get("description"), str):
        function["description"] = tool["description"]
    function["parameters"] = tool.get("input_schema") or {"type": "object", "properties": {}}
    return {"type": "function", "function": function}


def _text_of(blocks: Any) -> str:
    if isinstance(blocks, str):
        return blocks
    return "".join(b["text"] for b in blocks or [] if b.get("type") == "text")


def _chat_messages(role: str, content: Any) -> list[dict[str, Any]]:
    """One Messages turn as chat messages: tool results become ``tool`` messages, tool uses ``tool_calls``."""
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    out: list[dict[str, Any]] = []
    texts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []

    def flush_texts() -> None:
        if texts:
            out.append({"role": role, "content": list(texts)})
            texts.clear()

    for block in content:
        kind = block["type"]
        if kind == "text":
            texts.append({"type": "text", "text": block["text"]})
        elif kind == "tool_result":
            # A tool's answer is its own chat message, in the order given.
            flush_texts()
            text = _text_of(block.get("content"))
            out.append({"role": "tool", "tool_call_id": block["tool_use_id"], "content": text})
        elif kind == "tool_use":
            arguments = json.dumps(block.get("input") or {})
            calls.append(
                {"id": block["id"], "type": "function", "function": {"name": block["name"], "arguments": arguments}}
            )
        # thinking blocks are the model's own earlier reasoning: chat has no place for them.
    if role == "assistant":
        text = "".join(t["text"] for t in texts)
        message: dict[str, Any] = {"role": "assistant", "content": text or None}
        if calls:
            message["tool_calls"] = calls
        return [*out, message] if (text or calls) else out
    flush_texts()
    return out


# --- chat answer → Message -----------------------------------------------------


def stop_reason(finish: str | None, matched: Any, stop_sequences: list[str]) -> tuple[str | None, str | None]:
    """Anthropic's ``stop_reason`` and ``stop_sequence`` for a chat ``finish_reason``.

    vLLM names the stop string that ended the answer in ``stop_reason``; a
    ``stop`` with one of the request's stop sequences there is
    ``stop_sequence``, any other ``stop`` is ``end_turn``.
    """
    if finish is None:
        return None, None
    if finish == "stop" and isinstance(matched, str) and matched in stop_sequences:
        return "stop_sequence", matched
    return STOP_REASONS.get(finish, "end_turn"), None


def _input_of(arguments: Any) -> dict[str, Any]:
    if isinstance(arguments, dict):
        return arguments
    try:
        value = json.loads(arguments) if isinstance(arguments, str) and arguments.strip() else {}
    except ValueError:
        # What the model wrote is kept, where a client can see it, rather than lost.
        return {"_unparsed_arguments": arguments}
    return value if isinstance(value, dict) else {"value": value}


def from_chat(answer: dict[str, Any], model: str, stop_sequences: list[str]) -> dict[str, Any]:
    """The Message for a (non-streamed) chat completion answer."""
    choices = answer.get("choices") or [{}]
    choice = choices[0] if isinstance(choices[0], dict) else {}
    message = choice.get("message") if isinstance(choice.get("message"), dict) else {}
    content: list[dict[str, Any]] = []
    if message.get("content"):
        content.append({"type": "text", "text": message["content"]})
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        content.append(
            {
                "type": "tool_use",
                "id": call.get("id") or f"toolu_{len(content)}",
                "name": function.get("name") or "",
                "input": _input_of(function.get("arguments")),
            }
        )
    reason, sequence = stop_reason(choice.get("finish_reason") or "stop", choice.get("stop_reason"), stop_sequences)
    usage = answer.get("usage") if isinstance(answer.get("usage"), dict) else {}
    return {
        "id": _message_id(answer.get("id")),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": {
            "input_tokens": usage.get("prompt_tokens") or 0,
            "output_tokens": usage.get("completion_tokens") or 0,
        },
    }


def _message_id(chat_id: Any) -> str:
    return f"msg_{chat_id}" if isinstance(chat_id, str) and chat_id else "msg_llmgw"


def usage_of(obj: Any) -> tuple[int, int] | None:
    """(input, output) tokens from a Message's ``usage``; None when it has none."""
    usage = obj.get("usage") if isinstance(obj, dict) else None
    if isinstance(usage, dict) and isinstance(usage.get("input_tokens"), int):
        output = usage.get("output_tokens")
        return usage["input_tokens"], output if isinstance(output, int) else 0
    return None


def engine_error(status: int, data: bytes) -> bytes:
    """An engine's refusal (an OpenAI-shaped error, or anything) in Anthropic's error shape, its message kept."""
    return error_body(status, f"the engine refused the request: {engine_message(data)}")


# --- streams -------------------------------------------------------------------


def event(name: str, data: dict[str, Any]) -> bytes:
    """One server-sent event as Anthropic sends them: ``event:`` names the ``type`` of its data."""
    return b"event: " + name.encode() + b"\ndata: " + json.dumps(data).encode() + b"\n\n"


@dataclass
class ChatStream:
    """Turns a chat completion's SSE stream into a Messages stream, chunk by chunk as it arrives.

    ``feed`` takes the engine's bytes and returns the Anthropic events they
    make now; ``tail`` ends the message (the stream ended); ``broken`` ends
    it with an error event. ``usage`` and ``text_chunks`` are what the
    gateway records, as tokens.StreamMeter gives them for chat.
    """

    model: str
    stop_sequences: list[str] = field(default_factory=list)
    usage: tuple[int, int] | None = None
    text_chunks: int = 0
    _buffer: bytearray = field(default_factory=bytearray)
    _started: bool = False
    _finished: bool = False
    _block: int = -1
    """Index of the content block open now; -1: none."""
    _block_kind: str = ""
    _tools: dict[int, int] = field(default_factory=dict)
    """Each chat tool call index to its content block index."""
    _stop: tuple[str | None, str | None] = (None, None)
    _matched: Any = None

    def feed(self, chunk: bytes) -> bytes:
        self._buffer += chunk
        out = bytearray()
        for event in sse.chat_events(self._buffer):
            if not self._finished:
                out += self._end() if event is sse.DONE else self._chunk(event)
        return bytes(out)

    def tail(self) -> bytes:
        """The stream ended: close what is open (an engine that sent no ``[DONE]`` ends here)."""
        self._buffer.clear()
        return bytes(self._start() + self._end()) if not self._finished else b""

    def broken(self, message: str) -> bytes:
        """The engine broke off mid-answer: an ``error`` event, as Anthropic sends one mid-stream."""
        if self._finished:
            return b""
        self._finished = True
        return event("error", {"type": "error", "error": {"type": "api_error", "message": message}})

    def _start(self) -> bytes:
        if self._started:
            return b""
        self._started = True
        message = {
            "id": "msg_llmgw",
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0},
        }
        return event("message_start", {"type": "message_start", "message": message}) + event("ping", {"type": "ping"})

    def _chunk(self, obj: dict[str, Any]) -> bytes:
        out = bytearray(self._start())
        if isinstance(obj.get("error"), dict):
            out += self.broken(str(obj["error"].get("message") or "the engine reported an error"))
            return bytes(out)
        usage = obj.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("prompt_tokens"), int):
            self.usage = (usage["prompt_tokens"], usage.get("completion_tokens") or 0)
        timings = obj.get("timings")
        if isinstance(timings, dict) and isinstance(timings.get("prompt_n"), int):
            self.usage = (timings["prompt_n"], timings.get("predicted_n") or 0)
        choices = obj.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return bytes(out)
        choice = choices[0]
        delta = choice.get("delta") if isinstance(choice.get("delta"), dict) else {}
        text = delta.get("content")
        if isinstance(text, str) and text:
            self.text_chunks += 1
            out += self._open("text", {"type": "text", "text": ""})
            out += self._delta({"type": "text_delta", "text": text})
        for call in delta.get("tool_calls") or []:
            if isinstance(call, dict):
                self.text_chunks += 1
                out += self._tool(call)
        if choice.get("stop_reason") is not None:
            self._matched = choice["stop_reason"]
        if choice.get("finish_reason"):
            self._stop = stop_reason(choice["finish_reason"], self._matched, self.stop_sequences)
        return bytes(out)

    def _tool(self, call: dict[str, Any]) -> bytes:
        out = bytearray()
        index = call.get("index", 0)
        function = call.get("function") if isinstance(call.get("function"), dict) else {}
        if index not in self._tools:
            block = {"type": "tool_use", "id": call.get("id") or f"toolu_{index}", "name": function.get("name") or ""}
            out += self._open("tool_use", {**block, "input": {}}, force=True)
            self._tools[index] = self._block
        elif self._tools[index] != self._block:
            # Engines send one call's pieces together; a late piece of an earlier call has no open block to go to.
            return b""
        arguments = function.get("arguments")
        if isinstance(arguments, str) and arguments:
            out += self._delta({"type": "input_json_delta", "partial_json": arguments})
        return bytes(out)

    def _open(self, kind: str, block: dict[str, Any], *, force: bool = False) -> bytes:
        if self._block >= 0 and self._block_kind == kind and not force:
            return b""
        out = self._close()
        self._block += 1
        self._block_kind = kind
        data = {"type": "content_block_start", "index": self._block, "content_block": block}
        return out + event("content_block_start", data)

    def _close(self) -> bytes:
        if self._block < 0 or not self._block_kind:
            return b""
        self._block_kind = ""
        return event("content_block_stop", {"type": "content_block_stop", "index": self._block})

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return event("content_block_delta", {"type": "content_block_delta", "index": self._block, "delta": delta})

    def _end(self) -> bytes:
        out = bytearray(self._start())
        out += self._close()
        self._finished = True
        # No finish_reason came: the engine stopped as at a ``stop`` (what from_chat assumes too).
        reason, sequence = self._stop if self._stop[0] else stop_reason("stop", self._matched, self.stop_sequences)
        prompt, completion = self.usage or (0, self.text_chunks)
        delta = {"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence}}
        delta["usage"] = {"input_tokens": prompt, "output_tokens": completion}
        out += event("message_delta", delta)
        out += event("message_stop", {"type": "message_stop"})
        return bytes(out)


@dataclass
class NativeStream:
    """Relays an engine's own Messages stream untouched, event by event, reading its token counts."""

    usage: tuple[int, int] | None = None
    text_chunks: int = 0
    _buffer: bytearray = field(default_factory=bytearray)

    def feed(self, chunk: bytes) -> bytes:
        self._buffer += chunk
        out = bytearray()
        for raw in sse.split(self._buffer):
            self._read(raw)
            out += raw + b"\n\n"
        return bytes(out)

    def tail(self) -> bytes:
        rest = bytes(self._buffer)
        self._buffer.clear()
        return rest

    def broken(self, message: str) -> bytes:
        return self.tail() + event("error", {"type": "error", "error": {"type": "api_error", "message": message}})

    def _read(self, raw: bytes) -> None:
        data = sse.data(raw)
        try:
            obj = json.loads(data) if data else None
        except ValueError:
            return
        if not isinstance(obj, dict):
            return
        kind = obj.get("type")
        if kind == "message_start" and isinstance(obj.get("message"), dict):
            found = usage_of(obj["message"])
            if found is not None:
                self.usage = found
        elif kind == "message_delta" and isinstance(obj.get("usage"), dict):
            usage = obj["usage"]
            prompt = usage.get("input_tokens")
            if not isinstance(prompt, int):
                prompt = self.usage[0] if self.usage else 0
            output = usage.get("output_tokens")
            self.usage = (prompt, output if isinstance(output, int) else 0)
        elif kind == "content_block_delta":
            self.text_chunks += 1


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true or false"
    return {str: "text", int: "a number", float: "a number", list: "a list", dict: "an object"}.get(
        type(value), type(value).__name__
    )
