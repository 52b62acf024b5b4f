"""Token counts: the engine's own when it sends them, llmgw's when it does not.

vLLM and SGLang put ``usage`` in a non-streamed answer and, when asked with
``stream_options.include_usage``, in a last streamed chunk. llama.cpp's
stream carries no ``usage`` but its last chunk has ``timings`` with
``prompt_n`` and ``predicted_n``, which are its own counts too. When neither
comes, llmgw counts: each streamed chunk that carries text is one token (an
engine streams a token per chunk), and the prompt is counted by the engine's
``/tokenize`` when it has one, else by its bound (``Prompt.bound``).
Records counted that way say so (``counted_by = llmgw``).

Budget reservations never wait for an engine: they use the bound, computed
from the request alone before admission, so they cost no round trip.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from gateway.upstream import UpstreamError

TOKENIZE_TIMEOUT_S = 2.0
CHARS_PER_TOKEN = 4
NON_TEXT_TOKENS = 16_384
"""What one image, audio, video or file part of a prompt is assumed to cost.

Engines turn such a part into a number of tokens that depends on the model
and the media (LLaVA 576, Llama 3.2 Vision up to 6,404, Qwen2-VL up to
16,384 at its default largest picture), and nothing in the request says how
many: the largest common one is assumed, so a reservation is never short.
"""
PER_PIECE_TOKENS = 8
"""Tokens a chat template or tokenizer may add per message or prompt (role markers, BOS/EOS, a prefix space)."""
PER_REQUEST_TOKENS = 64
"""Tokens a chat template may add once per request (a default system line, the generation prompt)."""
NON_TEXT_TYPES = frozenset(
    {"image_url", "image", "input_image", "input_audio", "audio_url", "audio", "video_url", "video"}
    | {"file", "input_file"}
)
# Body fields an engine renders into the prompt besides messages, prompt and input.
RENDERED_FIELDS = ("tool_choice", "documents", "chat_template_kwargs", "suffix")


@dataclass
class Prompt:
    """What a request's prompt is made of, for bounding and counting its tokens.

    The bound is UTF-8 bytes, not characters over four: every tokenizer an
    engine uses (byte-level BPE, SentencePiece with byte fallback) makes a
    token of at least one byte, so a prompt's bytes are at least its tokens
    whatever its script. English text is about four bytes a token, so the
    bound is about four times the real count there and about right for CJK
    (three bytes a character, often a token each).
    """

    text: list[str] = field(default_factory=list)
    """Every piece of text the engine tokenizes: message strings, prompts, inputs, tools as JSON."""
    token_ids: int = 0
    """Tokens the client sent as ids (``prompt`` or ``input`` as lists of integers): counted exactly."""
    non_text: int = 0
    """Image, audio, video and file parts: NON_TEXT_TOKENS each."""
    pieces: int = 0
    """Messages, prompts and inputs: each may add PER_PIECE_TOKENS of template and special tokens."""
    sequences: int = 1
    """Prompts generated from: a completion's list of prompts is answered prompt by prompt."""

    @property
    def joined(self) -> str:
        return "\n".join(self.text)

    def bound(self) -> int:
        """At least as many tokens as any engine makes of this prompt (see the class's docstring)."""
        size = sum(len(t.encode()) for t in self.text)
        return (
            size
            + self.token_ids
            + self.non_text * NON_TEXT_TOKENS
            + self.pieces * PER_PIECE_TOKENS
            + (PER_REQUEST_TOKENS)
        )

    def known(self, text_tokens: int) -> int:
        """The prompt's tokens given the tokenizer's count of its text: ids and non-text parts added."""
        return text_tokens + self.token_ids + self.non_text * NON_TEXT_TOKENS


def estimate(text: str) -> int:
    """A guess at an answer's tokens from its text, four characters a token: for a record, never a reservation.

    Used only where an engine answered without counting its own answer;
    budgets reserve by ``Prompt.bound`` and max_tokens instead.
    """
    return -(-len(text) // CHARS_PER_TOKEN)


def _walk(value, prompt: Prompt) -> None:
    """Every string and number in a message or a content part, non-text parts counted apart."""
    if isinstance(value, str):
        prompt.text.append(value)
    elif isinstance(value, bool) or value is None:
        return
    elif isinstance(value, int | float):
        prompt.text.append(str(value))
    elif isinstance(value, list):
        for item in value:
            _walk(item, prompt)
    elif isinstance(value, dict):
        kind = value.get("type")
        if (isinstance(kind, str) and kind in NON_TEXT_TYPES) or any(k in NON_TEXT_TYPES for k in value if k != "type"):
            prompt.non_text += 1
            return
        for name, item in value.items():
            # A role is a template's marker and a type a part's kind, neither
            # text: PER_PIECE_TOKENS covers them.
            if name not in ("role", "type"):
                _walk(item, prompt)


def _sequences(value, prompt: Prompt) -> int:
    """Add a ``prompt`` or ``input`` (text, token ids, or a list of either); how many sequences it holds."""
    if isinstance(value, str):
        prompt.text.append(value)
        prompt.pieces += 1
        return 1
    if not isinstance(value, list) or not value:
        return 0
    if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        prompt.token_ids += len(value)
        prompt.pieces += 1
        return 1
    return sum(_sequences(v, prompt) if isinstance(v, str | list) else _other(v, prompt) for v in value)


def _other(value, prompt: Prompt) -> int:
    _walk(value, prompt)
    prompt.pieces += 1
    return 1


def prompt_of(body: Mapping) -> Prompt:
    """Everything in a request an engine turns into prompt tokens."""
    prompt = Prompt()
    messages = body.get("messages")
    if isinstance(messages, list):
        for message in messages:
            _walk(message, prompt)
            prompt.pieces += 1
    for name in ("tools", "functions"):
        if body.get(name):
            # Templates render tools as JSON, some indented by four: the
            # indented, ASCII-escaped form has at least the bytes of any of them.
            prompt.text.append(json.dumps(body[name], indent=4))
    for name in RENDERED_FIELDS:
        _walk(body.get(name), prompt)
    count = 0
    for name in ("prompt", "input"):
        count += _sequences(body.get(name), prompt)
    prompt.sequences = max(count, 1)
    return prompt


# The fields a client bounds a completion's length by, the first one set deciding, per protocol as
# the gateway reads it. Chat follows OpenAI: max_completion_tokens replaces the deprecated max_tokens.
# A completion knows only max_tokens. Messages and Responses are bounded as the chat request they are
# translated to (their max_tokens and max_output_tokens become its max_tokens).
ASKED_BY = {"completions": ("max_tokens",)}
CHAT_ASKED_BY = ("max_completion_tokens", "max_tokens")
# The fields an engine takes a completion's length from, per path it is asked on: each is set to the
# bound, so whichever an engine reads (vLLM's and SGLang's chat read max_completion_tokens, then
# max_tokens; their completions and llama-cpp-python's server only max_tokens), it generates no more
# than was reserved.
SENT_AS = {
    "chat/completions": ("max_tokens", "max_completion_tokens"),
    "completions": ("max_tokens",),
    "messages": ("max_tokens",),
    "responses": ("max_output_tokens",),
}
ALSO_READ = ("max_tokens", "max_completion_tokens", "n_predict")
"""Length fields some engine reads on any path (llama.cpp's own server reads ``n_predict`` before
``max_tokens``): where a client sent one, it is overwritten with the bound too."""


def per_choice(body: Mapping, endpoint: str, default: int) -> int:
    """The most tokens one choice of one prompt may have: the length the body asks for, else ``default``."""
    if endpoint == "embeddings":
        return 0
    fields = ASKED_BY.get(endpoint, CHAT_ASKED_BY)
    return next((n for n in (_positive(body.get(name)) for name in fields) if n), default)


def completion_bound(body: Mapping, prompt: Prompt, endpoint: str, default: int) -> int:
    """The most completion tokens a request may be answered with: ``per_choice`` for each choice.

    Choices are ``n`` (or ``best_of`` where larger: vLLM generates that many
    and returns the best) for each of the prompts.
    """
    choices = max(_positive(body.get("n")) or 1, _positive(body.get("best_of")) or 1)
    return per_choice(body, endpoint, default) * choices * prompt.sequences


def bounded(body: dict, path: str, per: int) -> dict:
    """``body`` as an engine gets it on ``path``: every field it may take a length from holds ``per``.

    One bound in every field rather than the client's fields as they came: an
    engine that reads another field than the one the reservation was made on
    (the issue's ``max_completion_tokens: 1, max_tokens: 256``) would
    otherwise generate past it. ``per`` 0 (embeddings) leaves the fields as they are. A copy.
    """
    out = dict(body)
    if not per:
        return out
    for name in SENT_AS.get(path, ()):
        out[name] = per
    for name in ALSO_READ:
        if name in out:
            out[name] = per
    return out


def within(used: tuple[int, int], bounds: tuple[int, int]) -> tuple[tuple[int, int], bool]:
    """``used`` (prompt, completion tokens) held to ``bounds``, and whether that took anything off.

    ``bounds`` are what the request's reservations were made on: its prompt's
    bound and its length for each choice, the most an engine sent that length
    can generate. An engine reporting more (a bug, a hostile rank 0 that
    answered a ``max_tokens: 5`` request with 2**31-1 tokens each way) is
    taken at the bound: a client is never charged, nor a ``tpm`` spent, past
    what the request could use.
    """
    held = (min(used[0], bounds[0]), min(used[1], bounds[1]))
    return held, held != used


def _positive(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


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

    def broken(self, message: str) -> bytes:
        """The engine broke off mid-answer: a chat stream ends where it was cut (it has no error event)."""
        return self.tail()

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


def _count(data) -> int | None:
    """The token count in a ``/tokenize`` answer: vLLM's and SGLang's ``count``, llama.cpp's ``tokens``."""
    if not isinstance(data, dict):
        return None
    count = data.get("count")
    if isinstance(count, int) and not isinstance(count, bool) and count >= 0:
        return count
    if isinstance(data.get("tokens"), list):
        return len(data["tokens"])
    return None


async def count_prompt(client, endpoint: str, model: str, prompt: Prompt) -> int:
    """The prompt's tokens by the engine's ``/tokenize``, else its bound.

    vLLM and SGLang read ``prompt``, llama.cpp reads ``content``; each adds
    its special tokens when asked. The tokenizer counts the text; tokens sent
    as ids and non-text parts are added as the bound counts them. An engine
    without ``/tokenize`` (404, no answer within TOKENIZE_TIMEOUT_S, an
    answer with no count) gets the bound, never less. ``client`` is a
    gateway.upstream.Client.
    """
    if not prompt.text:
        return prompt.known(0)
    text = prompt.joined
    body = json.dumps(
        {"model": model, "prompt": text, "add_special_tokens": True, "content": text, "add_special": True}
    ).encode()

    async def ask() -> dict | None:
        answer = await client.post(f"{endpoint}/tokenize", body)
        data = await answer.read()
        return json.loads(data) if answer.status == 200 else None

    try:
        counted = _count(await asyncio.wait_for(ask(), TOKENIZE_TIMEOUT_S))
    except (OSError, ValueError, TimeoutError, asyncio.IncompleteReadError, UpstreamError):
        counted = None
    return prompt.bound() if counted is None else prompt.known(counted)
