"""OpenAI's Responses API (``POST /v1/responses``), its stateless subset, in terms of chat completions.

What is taken: ``input`` (text, or a list of messages, ``function_call``
and ``function_call_output`` items), ``instructions``, function ``tools``
and ``tool_choice``, ``max_output_tokens``, ``temperature``, ``top_p``,
``stream``. llmgw stores no responses, so ``previous_response_id`` is
refused with a sentence (send the whole conversation in ``input``), and so
are built-in tools (web search, file search) and non-text input parts. The
chat answer comes back as a Response; a stream is translated chunk by chunk
into the Responses events (``response.created``, ``response.output_text.delta``,
…, ``response.completed``). Pure: no Django, no I/O.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from gateway import sse

ROLES = ("user", "assistant", "system", "developer")
TEXT_PARTS = ("input_text", "output_text", "text")


def problem(body: dict[str, Any]) -> str | None:
    """A sentence saying what is wrong with a Responses body, or None."""
    if body.get("previous_response_id") is not None:
        return (
            "previous_response_id is not served here: this gateway stores no responses, "
            "so send the whole conversation in input"
        )
    value = body.get("max_output_tokens")
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 2**31 - 1):
        return "max_output_tokens must be a whole number from 1 to 2,147,483,647"
    if body.get("instructions") is not None and not isinstance(body["instructions"], str):
        return "instructions must be text"
    found = _input(body.get("input"))
    if found:
        return found
    for i, tool in enumerate(body.get("tools") or []):
        if isinstance(tool, dict) and (tool.get("type") != "function" or not isinstance(tool.get("name"), str)):
            return (
                f"tools[{i}] must be a function tool ({{'type': 'function', 'name': …}}); built-in tools are not served"
            )
    return None


def _input(given: Any) -> str | None:
    if isinstance(given, str):
        return None if given else "input must not be empty"
    if not isinstance(given, list) or not given:
        return "input must be text or a non-empty list of messages and function call items"
    for i, item in enumerate(given):
        found = _item(item, f"input[{i}]")
        if found:
            return found
    return None


def _item(item: Any, where: str) -> str | None:
    if not isinstance(item, dict):
        return f"{where} must be an object, not {type(item).__name__}"
    kind = item.get("type", "message")
    if kind == "message":
        if item.get("role") not in ROLES:
            return f"{where}.role must be one of user, assistant, system, developer"
        content = item.get("content")
        if isinstance(content, str):
            return None
        if not isinstance(content, list):
            return f"{where}.content must be text or a list of input_text parts"
        for j, part in enumerate(content):
            if (
                not isinstance(part, dict)
                or part.get("type") not in TEXT_PARTS
                or not isinstance(part.get("text"), str)
            ):
                return f"{where}.content[{j}] must be an input_text part with text; other inputs are not served here"
        return None
    if kind == "function_call":
        if not all(isinstance(item.get(k), str) for k in ("call_id", "name", "arguments")):
            return f"{where} (function_call) needs call_id, name and arguments, all text"
        return None
    if kind == "function_call_output":
        if not isinstance(item.get("call_id"), str) or not isinstance(item.get("output"), str):
            return f"{where} (function_call_output) needs call_id and output, both text"
        return None
    return f"{where} has type {kind!r}, which /v1/responses here does not serve"


def _text(content: Any) -> str:
    return content if isinstance(content, str) else "".join(p["text"] for p in content)


def to_chat(body: dict[str, Any]) -> dict[str, Any]:
    """The chat completion request that asks what ``body`` (a Responses request ``problem`` passed) asks."""
    messages: list[dict[str, Any]] = []
    if body.get("instructions"):
        messages.append({"role": "system", "content": body["instructions"]})
    given = body["input"]
    items = [{"role": "user", "content": given}] if isinstance(given, str) else given
    for item in items:
        kind = item.get("type", "message")
        if kind == "message":
            role = "system" if item["role"] == "developer" else item["role"]
            messages.append({"role": role, "content": _text(item["content"])})
        elif kind == "function_call":
            call = {"id": item["call_id"], "type": "function"}
            call["function"] = {"name": item["name"], "arguments": item["arguments"]}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and "tool_calls" in last:
                last["tool_calls"].append(call)  # parallel calls are one assistant turn in chat
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        else:
            messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": item["output"]})
    chat: dict[str, Any] = {"model": body.get("model"), "messages": messages}
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    for name in ("temperature", "top_p", "stream", "parallel_tool_calls", "user"):
        if body.get(name) is not None:
            chat[name] = body[name]
    tools = [t for t in body.get("tools") or [] if isinstance(t, dict)]
    if tools:
        chat["tools"] = [
            {
                "type": "function",
                "function": {k: t[k] for k in ("name", "description", "parameters", "strict") if t.get(k) is not None},
            }
            for t in tools
        ]
    choice = body.get("tool_choice")
    if isinstance(choice, str):
        chat["tool_choice"] = choice
    elif isinstance(choice, dict) and choice.get("type") == "function":
        chat["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
    return chat


# --- the answer ----------------------------------------------------------------


def _usage(prompt: int, completion: int) -> dict[str, Any]:
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + completion,
    }


def _shell(rid: str, model: str, request: dict[str, Any], status: str) -> dict[str, Any]:
    """A Response's fields besides its output, as the official clients read them."""
    return {
        "id": rid,
        "object": "response",
        "created_at": int(time.time()),
        "status": status,
        "error": None,
        "incomplete_details": None,
        "instructions": request.get("instructions"),
        "max_output_tokens": request.get("max_output_tokens"),
        "model": model,
        "output": [],
        "parallel_tool_calls": request.get("parallel_tool_calls", True),
        "previous_response_id": None,
        "store": False,
        "temperature": request.get("temperature"),
        "text": {"format": {"type": "text"}},
        "tool_choice": request.get("tool_choice", "auto"),
        "tools": request.get("tools") or [],
        "top_p": request.get("top_p"),
        "truncation": "disabled",
        "usage": None,
        "metadata": request.get("metadata") or {},
    }


def _finish(response: dict[str, Any], finish: str | None, usage: tuple[int, int]) -> None:
    if finish == "length":
        response["status"] = "incomplete"
        response["incomplete_details"] = {"reason": "max_output_tokens"}
    elif finish == "content_filter":
        response["status"] = "incomplete"
        response["incomplete_details"] = {"reason": "content_filter"}
    else:
        response["status"] = "completed"
    response["usage"] = _usage(*usage)


def _message(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    part = {"type": "output_text", "text": text, "annotations": []}
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": [part]}


def _call(item_id: str, call_id: str, name: str, arguments: str, status: str = "completed") -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


def _ids(chat_id: Any) -> str:
    return chat_id if isinstance(chat_id, str) and chat_id else "llmgw"


def from_chat(answer: dict[str, Any], model: str, request: dict[str, Any]) -> dict[str, Any]:
    """The Response for a (non-streamed) chat completion answer."""
    base = _ids(answer.get("id"))
    choices = answer.get("choices") or [{}]
    choice = choices[0] if isinstance(choices[0], dict) else {}
    message = choice.get("message") if isinstance(choice.get("message"), dict) else {}
    response = _shell(f"resp_{base}", model, request, "completed")
    if message.get("content"):
        response["output"].append(_message(f"msg_{base}", message["content"]))
    for i, call in enumerate(message.get("tool_calls") or []):
        function = call.get("function") or {}
        arguments = function.get("arguments")
        arguments = arguments if isinstance(arguments, str) else json.dumps(arguments or {})
        response["output"].append(
            _call(f"fc_{base}_{i}", call.get("id") or f"call_{i}", function.get("name") or "", arguments)
        )
    usage = answer.get("usage") if isinstance(answer.get("usage"), dict) else {}
    _finish(
        response, choice.get("finish_reason"), (usage.get("prompt_tokens") or 0, usage.get("completion_tokens") or 0)
    )
    return response


def event(name: str, data: dict[str, Any]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + json.dumps({"type": name, **data}).encode() + b"\n\n"


@dataclass
class ChatStream:
    """Turns a chat completion's SSE stream into the Responses events, chunk by chunk as it arrives.

    The same interface as gateway.anthropic.ChatStream: ``feed``, ``tail``,
    ``broken``, ``usage``, ``text_chunks``.
    """

    model: str
    request: dict[str, Any] = field(default_factory=dict)
    usage: tuple[int, int] | None = None
    text_chunks: int = 0
    _buffer: bytearray = field(default_factory=bytearray)
    _seq: int = 0
    _response: dict[str, Any] | None = None
    _open: dict[str, Any] | None = None
    """The output item being streamed: a message or a function call."""
    _tools: dict[int, int] = field(default_factory=dict)
    _finish: str | None = None
    _finished: bool = False

    def feed(self, chunk: bytes) -> bytes:
        self._buffer += chunk
        out = bytearray()
        for event in sse.chat_events(self._buffer):
            if not self._finished:
                out += self._end() if event is sse.DONE else self._chunk(event)
        return bytes(out)

    def tail(self) -> bytes:
        self._buffer.clear()
        return b"" if self._finished else self._end()

    def broken(self, message: str) -> bytes:
        if self._finished:
            return b""
        self._finished = True
        out = self._start()
        response = dict(self._response, status="failed", error={"code": "server_error", "message": message})
        return out + self._event("response.failed", {"response": response})

    def _event(self, name: str, data: dict[str, Any]) -> bytes:
        self._seq += 1
        return event(name, {"sequence_number": self._seq - 1, **data})

    def _start(self) -> bytes:
        if self._response is not None:
            return b""
        self._response = _shell("resp_llmgw", self.model, self.request, "in_progress")
        created = self._event("response.created", {"response": self._response})
        return created + self._event("response.in_progress", {"response": self._response})

    def _chunk(self, obj: dict[str, Any]) -> bytes:
        out = bytearray(self._start())
        if isinstance(obj.get("error"), dict):
            return bytes(out + self.broken(str(obj["error"].get("message") or "the engine reported an error")))
        usage = obj.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("prompt_tokens"), int):
            self.usage = (usage["prompt_tokens"], usage.get("completion_tokens") or 0)
        choices = obj.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return bytes(out)
        choice = choices[0]
        delta = choice.get("delta") if isinstance(choice.get("delta"), dict) else {}
        text = delta.get("content")
        if isinstance(text, str) and text:
            self.text_chunks += 1
            out += self._text(text)
        for call in delta.get("tool_calls") or []:
            if isinstance(call, dict):
                self.text_chunks += 1
                out += self._tool(call)
        if choice.get("finish_reason"):
            self._finish = choice["finish_reason"]
        return bytes(out)

    def _where(self) -> dict[str, Any]:
        return {"item_id": self._open["id"], "output_index": len(self._response["output"])}

    def _text(self, text: str) -> bytes:
        out = bytearray()
        if self._open is None or self._open["type"] != "message":
            out += self._close()
            self._open = _message(f"msg_llmgw_{len(self._response['output'])}", "", "in_progress")
            item = {**self._open, "content": []}
            out += self._event(
                "response.output_item.added", {"output_index": len(self._response["output"]), "item": item}
            )
            part = {"type": "output_text", "text": "", "annotations": []}
            out += self._event("response.content_part.added", {**self._where(), "content_index": 0, "part": part})
        self._open["content"][0]["text"] += text
        delta = {**self._where(), "content_index": 0, "delta": text, "logprobs": []}
        return bytes(out + self._event("response.output_text.delta", delta))

    def _tool(self, call: dict[str, Any]) -> bytes:
        out = bytearray()
        index = call.get("index", 0)
        function = call.get("function") if isinstance(call.get("function"), dict) else {}
        if index not in self._tools:
            out += self._close()
            at = len(self._response["output"])
            self._open = _call(
                f"fc_llmgw_{at}", call.get("id") or f"call_{index}", function.get("name") or "", "", "in_progress"
            )
            self._tools[index] = at
            out += self._event("response.output_item.added", {"output_index": at, "item": dict(self._open)})
        elif self._tools[index] != len(self._response["output"]):
            return b""
        arguments = function.get("arguments")
        if isinstance(arguments, str) and arguments:
            self._open["arguments"] += arguments
            out += self._event("response.function_call_arguments.delta", {**self._where(), "delta": arguments})
        return bytes(out)

    def _close(self) -> bytes:
        if self._open is None:
            return b""
        item, where = self._open, self._where()
        out = bytearray()
        if item["type"] == "message":
            part = item["content"][0]
            done = {**where, "content_index": 0, "text": part["text"], "logprobs": []}
            out += self._event("response.output_text.done", done)
            out += self._event("response.content_part.done", {**where, "content_index": 0, "part": part})
        else:
            done = {**where, "arguments": item["arguments"]}
            out += self._event("response.function_call_arguments.done", done)
        item["status"] = "completed"
        out += self._event("response.output_item.done", {"output_index": where["output_index"], "item": item})
        self._response["output"].append(item)
        self._open = None
        return bytes(out)

    def _end(self) -> bytes:
        out = bytearray(self._start())
        out += self._close()
        self._finished = True
        _finish(self._response, self._finish, self.usage or (0, self.text_chunks))
        name = "response.completed" if self._response["status"] == "completed" else "response.incomplete"
        return bytes(out + self._event(name, {"response": self._response}))
