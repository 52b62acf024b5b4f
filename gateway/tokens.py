"""Token counts: the engine's own when it sends them, llmgw's when it does not.

vLLM and SGLang put ``usage`` in a non-streamed answer and, when asked with
``stream_options.include_usage``, in a last streamed chunk. llama.cpp's
stream carries no ``usage`` but its last chunk has ``timings`` with
``prompt_n`` and ``predicted_n``, which are its own counts too. When neither
comes, llmgw counts: each streamed chunk that carries text is one token (an
engine streams a token per chunk), and the prompt is counted by the engine's
``/tokenize`` when it has one, else estimated at four characters a token.
Records counted that way say so (``counted_by = llmgw``).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from gateway.upstream import UpstreamError

TOKENIZE_TIMEOUT_S = 2.0
CHARS_PER_TOKEN = 4


def estimate(text: str) -> int:
    return -(-len(text) // CHARS_PER_TOKEN)


def prompt_text(body: Mapping) -> str:
    """All the prompt's text, for estimating its size and counting its tokens."""
    messages = body.get("messages")
    if isinstance(messages, list):
        out = []
        for message in messages:
            if isinstance(message, dict):
                content = message.get("content")
                if isinstance(content, list):
                    content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
                if isinstance(content, str):
                    out.append(content)
        return "\n".join(out)
    for name in ("prompt", "input"):
        value = body.get(name)
        if isinstance(value, str):
            return value
        if isinstance(value, list):
            return "\n".join(v for v in value if isinstance(v, str))
    return ""


def usage_of(obj: Mapping) -> tuple[int, int] | None:
    """(prompt, completion) from an answer's ``usage`` or llama.cpp's ``timings``; None when neither."""
    usage = obj.get("usage")
    if isinstance(usage, dict) and isinstance(usage.get("prompt_tokens"), int):
        completion = usage.get("completion_tokens")
        return usage["prompt_tokens"], completion if isinstance(completion, int) else 0
    timings = obj.get("timings")
    if isinstance(timings, dict) and isinstance(timings.get("prompt_n"), int):
        predicted = timings.get("predicted_n")
        return timings["prompt_n"], predicted if isinstance(predicted, int) else 0
    return None


def _carries_text(obj: Mapping) -> bool:
    choices = obj.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return False
    choice = choices[0]
    delta = choice.get("delta")
    if isinstance(delta, dict):
        return bool(delta.get("content") or delta.get("reasoning_content") or delta.get("tool_calls"))
    return bool(choice.get("text"))


def _next_boundary(buffer: bytes | bytearray, start: int) -> tuple[int, int]:
    """Where the next event ends and the one after it starts; (-1, -1) when incomplete."""
    lf = buffer.find(b"\n\n", start)
    crlf = buffer.find(b"\r\n\r\n", start)
    if crlf != -1 and (lf == -1 or crlf < lf):
        return crlf, crlf + 4
    if lf != -1:
        return lf, lf + 2
    return -1, -1


@dataclass
class StreamMeter:
    """Reads a server-sent event stream as it passes through, event by event.

    ``feed`` returns the bytes to pass on now: every complete event, in the
    order received (an event is a token, so holding back a partial one
    delays nothing a client could use). With ``drop_usage_chunk`` the
    usage-only chunk llmgw asked for on the client's behalf is not passed
    on, so a client that did not ask for it never sees it.
    """

    drop_usage_chunk: bool = False
    usage: tuple[int, int] | None = None
    text_chunks: int = 0
    _buffer: bytearray = field(default_factory=bytearray)

    def feed(self, chunk: bytes) -> bytes:
        self._buffer += chunk
        out = bytearray()
        start = 0
        while True:
            end, after = _next_boundary(self._buffer, start)
            if end == -1:
                break
            if self._keep(bytes(self._buffer[start:end])):
                out += self._buffer[start:after]
            start = after
        del self._buffer[:start]
        return bytes(out)

    def tail(self) -> bytes:
        """Whatever followed the last complete event (passed on as it is)."""
        rest = bytes(self._buffer)
        self._buffer.clear()
        return rest

    def _keep(self, event: bytes) -> bool:
        for line in event.splitlines():
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if not payload.startswith(b"{"):
                continue
            try:
                obj = json.loads(payload)
            except ValueError:
                continue
            if not isinstance(obj, dict):
                continue
            found = usage_of(obj)
            if found is not None:
                self.usage = found
            if _carries_text(obj):
                self.text_chunks += 1
            elif self.drop_usage_chunk and found is not None and obj.get("choices") == []:
                return False
        return True


async def count_prompt(client, endpoint: str, model: str, text: str) -> int:
    """The prompt's tokens by the engine's ``/tokenize`` (vLLM, llama.cpp), else an estimate.

    ``client`` is a gateway.upstream.Client.
    """
    body = json.dumps({"model": model, "prompt": text, "content": text}).encode()

    async def ask() -> dict | None:
        answer = await client.post(f"{endpoint}/tokenize", body)
        data = await answer.read()
        return json.loads(data) if answer.status == 200 else None

    try:
        data = await asyncio.wait_for(ask(), TOKENIZE_TIMEOUT_S)
    except (OSError, ValueError, TimeoutError, asyncio.IncompleteReadError, UpstreamError):
        data = None
    if isinstance(data, dict):
        if isinstance(data.get("count"), int):
            return data["count"]
        if isinstance(data.get("tokens"), list):
            return len(data["tokens"])
    return estimate(text)
