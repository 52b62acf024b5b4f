"""A fast fake OpenAI-compatible engine, for the gateway's tests and bench/gateway.py.

Plain asyncio streams, HTTP/1.1 with keep-alive, no framework: it must not
be the slowest thing in a benchmark. It answers ``/v1/chat/completions``,
``/v1/completions`` (plain and streamed, ``usage`` like vLLM or none like
llama.cpp), ``/v1/embeddings``, ``/v1/models`` and ``/tokenize`` (one token a
word, in vLLM's or llama.cpp's shape), and it notices a client that hangs up mid-stream.
With ``messages`` it also serves Anthropic's ``/v1/messages`` natively, as vLLM
and llama.cpp do (without, that path is 404, as SGLang answers it). With
``lora`` it serves LoRA adapters as vLLM started with ``--enable-lora`` does:
each loaded adapter is listed in ``/v1/models`` with its ``parent``, one more
is loaded by ``POST /v1/load_lora_adapter`` (``{lora_name, lora_path}``) and
one dropped by ``POST /v1/unload_lora_adapter`` (``{lora_name}``), and
a request naming neither the model nor a loaded adapter is answered 404.

Run on its own: ``python -m tests.gateway.fake_engine --port 9000``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import threading
import time
from dataclasses import dataclass, field

LOCKSTEP_WAIT_S = 5.0
"""How long a ``lockstep`` engine waits for the client to see a token before it sends the next anyway."""
TOKEN = re.compile(rb"(?<![A-Za-z0-9_])w(\d+)")
"""A token of this fake's answers (``w0``, ``w1``, …), as a client sees it in whatever the gateway made of it."""


@dataclass
class Behaviour:
    tokens: int = 8
    """Completion tokens each answer has (one streamed chunk each)."""
    token_delay_s: float = 0.0
    lockstep: bool = False
    """Stream token i only once the test has said it saw token i-1 (``FakeEngine.saw``). A gateway that
    holds a token back leaves the engine waiting: after ``LOCKSTEP_WAIT_S`` it sends the next anyway and
    counts it in ``Stats.unseen``. This proves tokens are passed on as they come without timing anything,
    which a loaded machine cannot promise."""
    usage: str = "vllm"
    """``vllm``: usage in plain answers and, when asked, in a last streamed chunk;
    ``llamacpp``: timings in the last chunk and never ``usage`` when streaming;
    ``none``: no counts anywhere."""
    fail_status: int = 0
    """Answer every completion with this status (0: answer normally)."""
    name: str = "fake"
    api_key: str = ""
    """When set, every path wants ``Authorization: Bearer <api_key>`` (401 without), as vLLM given a key."""
    tokenize: str = "vllm"
    """``/tokenize`` as ``vllm`` and SGLang answer it (reads ``prompt``, gives ``count`` and ``tokens``),
    as ``llamacpp`` does (reads ``content``, gives ``tokens``), ``none`` (404) or ``broken`` (no usable count)."""
    prompt_count: str = "words"
    """How the prompt's tokens are reported: ``words`` (one a word) or ``bytes`` (one a UTF-8 byte of the
    text, the most any real tokenizer makes: a prompt in a script the tokenizer knows badly)."""
    honour_max_tokens: bool = False
    """Answer with at most the length the first of ``reads`` the body sets asks for, as real engines do."""
    reads: tuple[str, ...] = ("max_completion_tokens", "max_tokens")
    """With ``honour_max_tokens``: the fields this engine takes a completion's length from, the first one set
    deciding: vLLM's and SGLang's chat read ``max_completion_tokens`` then ``max_tokens``; their
    ``/v1/completions`` and llama-cpp-python's server only ``max_tokens``; llama.cpp's own server
    ``n_predict`` then ``max_tokens``."""
    reports: tuple[int, int] | None = None
    """Usage this engine claims whatever it did (prompt, completion), in every shape it reports usage in:
    a hostile or broken rank-0 engine. None: its real counts."""
    messages: bool = False
    """Serve ``/v1/messages`` natively (plain and streamed in Anthropic's events); False: 404 there."""
    tool_call: str = ""
    """Chat answers call this tool (arguments ``{"q": "w0"}``, finish_reason ``tool_calls``) instead of text."""
    lora: bool = False
    """Serve LoRA adapters as vLLM does (see the module's docstring); False: names are not checked."""
    adapters: dict[str, str] = field(default_factory=dict)
    """With ``lora``: the adapters loaded at start, name to path (vLLM's ``--lora-modules name=path``)."""
    refuse_unreadable: bool = False
    """Answer 400 with a message, as vLLM, SGLang and llama.cpp do, to a body this fake cannot read,
    instead of dropping the connection (which a gateway would rightly report as the engine's failure)."""


@dataclass
class Stats:
    requests: int = 0
    completed: int = 0
    cancelled: int = 0
    bodies: list = field(default_factory=list)
    paths: list = field(default_factory=list)
    """The path each of ``bodies`` was sent to (``/v1/messages``, …), in the same order."""
    keep_bodies: bool = True
    headers: list = field(default_factory=list)
    """Each request's headers (lower-cased names), kept with the bodies: a test reads what the gateway sent."""
    unauthorized: int = 0
    unseen: int = 0
    """With ``lockstep``: tokens sent although the client had not seen the one before."""


def prompt_tokens(body: dict, count: str = "words") -> int:
    text = ""
    for m in body.get("messages") or []:
        if isinstance(m, dict) and isinstance(m.get("content"), str):
            text += " " + m["content"]
    if isinstance(body.get("prompt"), str):
        text += " " + body["prompt"]
    if isinstance(body.get("input"), str):
        text += " " + body["input"]
    return len(text.encode()) if count == "bytes" else len(text.split())


class FakeEngine:
    def __init__(self, behaviour: Behaviour | None = None) -> None:
        self.behaviour = behaviour or Behaviour()
        self.stats = Stats()
        self.adapters: dict[str, str] = dict(self.behaviour.adapters)
        """The adapters loaded now, name to path."""
        self.server: asyncio.base_events.Server | None = None
        self.port = 0
        self._seen = 0
        """With ``lockstep``: how many of the current stream's tokens the client has seen."""

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.server = await asyncio.start_server(self._connection, host, port, backlog=2048)
        self.port = self.server.sockets[0].getsockname()[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def saw(self, text: str | bytes) -> None:
        """Tell a ``lockstep`` engine the client has seen every token up to the last one ``text`` names.

        Safe from any thread: one int, set under the GIL and read by the engine's loop.
        """
        found = TOKEN.findall(text.encode() if isinstance(text, str) else text)
        if found:
            self._seen = max(self._seen, max(int(n) for n in found) + 1)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {}
                for line in lines[1:]:
                    if ":" in line:
                        k, v = line.split(":", 1)
                        headers[k.strip().lower()] = v.strip()
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                if self.stats.keep_bodies:
                    self.stats.headers.append(headers)
                if self.behaviour.api_key and headers.get("authorization") != f"Bearer {self.behaviour.api_key}":
                    self.stats.unauthorized += 1
                    self._json(writer, 401, {"error": {"message": "the engine's key is missing or wrong"}})
                    continue
                if not await self._handle(method, path, body, reader, writer):
                    break
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    async def _handle(self, method, path, raw, reader, writer) -> bool:
        b = self.behaviour
        if path == "/tokenize":
            return self._tokenize(writer, json.loads(raw or b"{}"))
        if path == "/v1/models":
            data = [{"id": b.name, "object": "model", "root": b.name, "parent": None}]
            data += [{"id": n, "object": "model", "root": p, "parent": b.name} for n, p in self.adapters.items()]
            return self._json(writer, 200, {"object": "list", "data": data})
        if path == "/v1/load_lora_adapter" and b.lora:
            return self._load_lora(writer, json.loads(raw or b"{}"))
        if path == "/v1/unload_lora_adapter" and b.lora:
            name = json.loads(raw or b"{}").get("lora_name")
            if self.adapters.pop(name, None) is None:
                return self._json(
                    writer, 404, {"object": "error", "message": f"The lora adapter '{name}' cannot be found."}
                )
            return self._json(writer, 200, {"message": f"Success: LoRA adapter '{name}' removed successfully."})
        if not path.startswith("/v1/"):
            return self._json(writer, 404, {"error": "not found"})
        if b.refuse_unreadable and (why := unreadable(path, raw)):
            return self._json(writer, 400, {"object": "error", "message": why, "type": "BadRequestError"})
        self.stats.requests += 1
        body = json.loads(raw)
        if self.stats.keep_bodies:
            self.stats.bodies.append(body)
            self.stats.paths.append(path)
        if b.lora and body.get("model") not in (b.name, *self.adapters):
            message = f"The model `{body.get('model')}` does not exist."
            return self._json(writer, 404, {"object": "error", "message": message, "type": "NotFoundError"})
        if b.fail_status:
            return self._json(writer, b.fail_status, {"error": {"message": "the fake engine is told to fail"}})
        prompt = prompt_tokens(body, b.prompt_count)
        if path == "/v1/embeddings":
            self.stats.completed += 1
            return self._json(
                writer,
                200,
                {
                    "object": "list",
                    "data": [{"object": "embedding", "index": 0, "embedding": [0.1, 0.2, 0.3]}],
                    "model": body.get("model"),
                    "usage": {"prompt_tokens": prompt, "total_tokens": prompt},
                },
            )
        if path == "/v1/messages":
            if not b.messages:
                self.stats.requests -= 1
                return self._json(writer, 404, {"detail": "Not Found"})
            return await self._messages(writer, reader, body)
        chat = path == "/v1/chat/completions"
        if chat and b.tool_call:
            return await self._tool_call(writer, body, prompt)
        if body.get("stream"):
            return await self._stream(writer, reader, body, chat, prompt)
        count = self._tokens(body)
        text = " ".join(f"w{i}" for i in range(count))
        finish = "length" if count < b.tokens else "stop"
        answer = {
            "id": "cmpl-fake",
            "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()),
            "model": body.get("model"),
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}
                if chat
                else {"index": 0, "text": text, "finish_reason": finish}
            ],
        }
        if b.usage != "none":
            said, done = self._claimed(prompt, count)
            answer["usage"] = {"prompt_tokens": said, "completion_tokens": done, "total_tokens": said + done}
        self.stats.completed += 1
        return self._json(writer, 200, answer)

    async def _tool_call(self, writer, body: dict, prompt: int) -> bool:
        """A chat answer that calls ``Behaviour.tool_call``, plain or streamed in pieces (as vLLM streams one)."""
        call = {"id": "call_fake", "type": "function", "function": {"name": self.behaviour.tool_call}}
        arguments = json.dumps({"q": "w0"})
        usage = {"prompt_tokens": prompt, "completion_tokens": 5, "total_tokens": prompt + 5}
        base = {"id": "cmpl-fake", "created": int(time.time()), "model": body.get("model")}
        self.stats.completed += 1
        if not body.get("stream"):
            message = {
                "role": "assistant",
                "content": None,
                "tool_calls": [{**call, "function": {**call["function"], "arguments": arguments}}],
            }
            choice = {"index": 0, "message": message, "finish_reason": "tool_calls"}
            return self._json(writer, 200, {**base, "object": "chat.completion", "choices": [choice], "usage": usage})
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        pieces = [
            {"index": 0, **call, "function": {**call["function"], "arguments": ""}},
            {"index": 0, "function": {"arguments": arguments[:5]}},
            {"index": 0, "function": {"arguments": arguments[5:]}},
        ]
        for i, piece in enumerate(pieces):
            choice = {"index": 0, "delta": {"tool_calls": [piece]}, "finish_reason": "tool_calls" if i == 2 else None}
            self._chunk(writer, b"data: " + json.dumps({**base, "choices": [choice]}).encode() + b"\n\n")
        if (body.get("stream_options") or {}).get("include_usage"):
            self._chunk(writer, b"data: " + json.dumps({**base, "choices": [], "usage": usage}).encode() + b"\n\n")
        self._chunk(writer, b"data: [DONE]\n\n")
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True

    async def _messages(self, writer, reader, body: dict) -> bool:
        """Anthropic's Messages, natively: a Message, or its events one token each."""
        b = self.behaviour
        count = self._tokens(body)
        said = self._claimed(messages_prompt_tokens(body), count)
        reason = "max_tokens" if count < b.tokens else "end_turn"
        message = {
            "id": "msg_fake",
            "type": "message",
            "role": "assistant",
            "model": body.get("model"),
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": said[0], "output_tokens": 0},
        }
        if not body.get("stream"):
            text = " ".join(f"w{i}" for i in range(count))
            message.update(content=[{"type": "text", "text": text}], stop_reason=reason)
            message["usage"] = {"input_tokens": said[0], "output_tokens": said[1]}
            self.stats.completed += 1
            return self._json(writer, 200, message)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")

        def send(name: str, data: dict) -> None:
            self._chunk(
                writer, f"event: {name}\ndata: ".encode() + json.dumps({"type": name, **data}).encode() + b"\n\n"
            )

        send("message_start", {"message": message})
        send("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}})
        self._seen = 0
        try:
            for i in range(count):
                if await self._before_token(i, reader, writer):
                    self.stats.cancelled += 1
                    return False
                send("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": f"w{i} "}})
                await writer.drain()
            send("content_block_stop", {"index": 0})
            delta = {"stop_reason": reason, "stop_sequence": None}
            send("message_delta", {"delta": delta, "usage": {"output_tokens": said[1]}})
            send("message_stop", {})
            writer.write(b"0\r\n\r\n")
            await writer.drain()
            self.stats.completed += 1
            return True
        except ConnectionError:
            self.stats.cancelled += 1
            return False

    def _load_lora(self, writer, body: dict) -> bool:
        """vLLM's runtime adapter loading: 200 and a sentence, 400 for a name already loaded or no path."""
        name, path = body.get("lora_name"), body.get("lora_path")
        if not isinstance(name, str) or not isinstance(path, str) or not name or not path:
            return self._json(writer, 400, {"object": "error", "message": "lora_name and lora_path are required"})
        if name in self.adapters:
            message = f"The lora adapter '{name}' has already been loaded."
            return self._json(writer, 400, {"object": "error", "message": message, "type": "InvalidUserInput"})
        self.adapters[name] = path
        text = f"Success: LoRA adapter '{name}' added successfully.".encode()
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: %d\r\n\r\n" % len(text) + text)
        return True

    def _tokenize(self, writer, body: dict) -> bool:
        """One token a word, in the answer shape of the engine ``tokenize`` names."""
        style = self.behaviour.tokenize
        if style == "none":
            return self._json(writer, 404, {"error": "not found"})
        if style == "broken":
            return self._json(writer, 200, {"count": -3, "tokens": "many"})
        text = body.get("content" if style == "llamacpp" else "prompt")
        tokens = list(range(len(text.split()))) if isinstance(text, str) else []
        if style == "llamacpp":
            return self._json(writer, 200, {"tokens": tokens})
        return self._json(writer, 200, {"count": len(tokens), "max_model_len": 4096, "tokens": tokens})

    def _tokens(self, body: dict) -> int:
        b = self.behaviour
        wanted = next((body[name] for name in b.reads if body.get(name)), None)
        if b.honour_max_tokens and isinstance(wanted, int) and wanted > 0:
            return min(b.tokens, wanted)
        return b.tokens

    def _claimed(self, prompt: int, completion: int) -> tuple[int, int]:
        """The (prompt, completion) usage this engine reports: its real counts, or ``Behaviour.reports``."""
        return self.behaviour.reports or (prompt, completion)

    async def _stream(self, writer, reader, body, chat, prompt) -> bool:
        b = self.behaviour
        count = self._tokens(body)
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n"
            b"cache-control: no-cache\r\n\r\n"
        )
        base = {"id": "cmpl-fake", "created": int(time.time()), "model": body.get("model")}
        base["object"] = "chat.completion.chunk" if chat else "text_completion"
        self._seen = 0
        try:
            for i in range(count):
                if await self._before_token(i, reader, writer):
                    self.stats.cancelled += 1
                    return False
                finish = "length" if count < b.tokens else "stop"
                choice = {"index": 0, "finish_reason": finish if i == count - 1 else None}
                if chat:
                    choice["delta"] = {"content": f"w{i} "} if i else {"role": "assistant", "content": "w0 "}
                else:
                    choice["text"] = f"w{i} "
                event = {**base, "choices": [choice]}
                if i == count - 1 and b.usage == "llamacpp":
                    said, done = self._claimed(prompt, count)
                    event["timings"] = {"prompt_n": said, "predicted_n": done}
                self._chunk(writer, b"data: " + json.dumps(event).encode() + b"\n\n")
                await writer.drain()
            options = body.get("stream_options") or {}
            if b.usage == "vllm" and options.get("include_usage"):
                said, done = self._claimed(prompt, count)
                usage = {"prompt_tokens": said, "completion_tokens": done, "total_tokens": said + done}
                self._chunk(writer, b"data: " + json.dumps({**base, "choices": [], "usage": usage}).encode() + b"\n\n")
            self._chunk(writer, b"data: [DONE]\n\n")
            writer.write(b"0\r\n\r\n")
            await writer.drain()
            self.stats.completed += 1
            return True
        except ConnectionError:
            self.stats.cancelled += 1
            return False

    async def _before_token(self, i: int, reader, writer) -> bool:
        """Wait for token i's turn (``lockstep``) and its delay; True as soon as the client hangs up."""
        b = self.behaviour
        if b.lockstep and i:
            deadline = time.monotonic() + LOCKSTEP_WAIT_S
            while self._seen < i:
                if reader.at_eof() or writer.transport.is_closing():
                    return True
                if time.monotonic() >= deadline:
                    self.stats.unseen += 1
                    break
                await asyncio.sleep(0.002)
        return bool(b.token_delay_s) and await self._hung_up(reader, writer, b.token_delay_s)

    @staticmethod
    async def _hung_up(reader, writer, wait_s: float) -> bool:
        """Wait ``wait_s``; True as soon as the client closes the connection.

        Watched through the stream's end-of-file flag rather than a read, which
        could swallow the first byte of the client's next request.
        """
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if reader.at_eof() or writer.transport.is_closing():
                return True
            await asyncio.sleep(min(0.01, max(0.0, deadline - time.monotonic())))
        return reader.at_eof()

    @staticmethod
    def _chunk(writer, data: bytes) -> None:
        writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")

    @staticmethod
    def _json(writer, status: int, obj) -> bool:
        data = json.dumps(obj).encode()
        reason = {200: "OK", 404: "Not Found"}.get(status, "Error")
        head = f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(data)}\r\n\r\n"
        writer.write(head.encode() + data)
        return True


def messages_prompt_tokens(body: dict) -> int:
    """A Messages request's prompt, one token a word: the system prompt and every text block."""
    text = body.get("system") if isinstance(body.get("system"), str) else ""
    for m in body.get("messages") or []:
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, str):
            text += " " + content
        elif isinstance(content, list):
            text += "".join(" " + c["text"] for c in content if isinstance(c, dict) and isinstance(c.get("text"), str))
    return len(text.split())


def unreadable(path: str, raw: bytes) -> str | None:
    """Why a real engine would refuse this body (and this fake fail on it), or None."""
    try:
        body = json.loads(raw or b"null")
    except ValueError as exc:
        return f"the body is not JSON: {exc}"
    if not isinstance(body, dict):
        return "the body must be a JSON object"
    if path.endswith("/chat/completions"):
        messages = body.get("messages")
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            return "messages must be a list of objects"
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        return "stream_options must be an object"
    try:
        prompt_tokens(body)
    except Exception as exc:  # noqa: BLE001 - whatever this fake would have died of is the refusal
        return f"the engine cannot read this request: {type(exc).__name__}: {exc}"
    return None


class EngineThread:
    """A FakeEngine on its own event loop in a thread, for tests that run servers as subprocesses."""

    def __init__(self, behaviour: Behaviour | None = None) -> None:
        self.engine = FakeEngine(behaviour)
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(self.loop)
            self.loop.run_until_complete(self.engine.start())
            ready.set()
            self.loop.run_forever()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        ready.wait(10)

    @property
    def url(self) -> str:
        return self.engine.url

    @property
    def stats(self) -> Stats:
        return self.engine.stats

    def saw(self, text: str | bytes) -> None:
        self.engine.saw(text)

    def stop(self) -> None:
        async def shut() -> None:
            self.engine.server.close()
            current = asyncio.current_task()
            tasks = [t for t in asyncio.all_tasks() if t is not current]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(shut(), self.loop).result(5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=9000)
    parser.add_argument("--tokens", type=int, default=8)
    parser.add_argument(
        "--token-delay", type=float, default=0.0, metavar="S", help="Seconds before each streamed token."
    )
    parser.add_argument("--usage", default="vllm", choices=["vllm", "llamacpp", "none"])
    parser.add_argument("--name", default="fake", help="The model's name, as --served-model-name gives it.")
    parser.add_argument("--lora", action="store_true", help="Serve LoRA adapters as vLLM --enable-lora does.")
    parser.add_argument("--adapter", action="append", default=[], metavar="NAME=PATH", help="An adapter at start.")
    args = parser.parse_args()
    adapters = dict(a.split("=", 1) for a in args.adapter)

    async def serve() -> None:
        behaviour = Behaviour(
            tokens=args.tokens,
            token_delay_s=args.token_delay,
            usage=args.usage,
            name=args.name,
            lora=args.lora,
            adapters=adapters,
        )
        engine = FakeEngine(behaviour)
        engine.stats.keep_bodies = False
        await engine.start(port=args.port)
        print(f"fake engine on {engine.url}", flush=True)
        await asyncio.Event().wait()

    with contextlib.suppress(KeyboardInterrupt):
        try:
            import uvloop  # type: ignore[import-not-found]

            uvloop.run(serve())
        except ImportError:
            asyncio.run(serve())


if __name__ == "__main__":
    main()
