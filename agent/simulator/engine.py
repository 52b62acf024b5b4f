"""A fake OpenAI-compatible engine for simulated shards, and the simulated node's shard keeper.

Each shard placed on a simulated node gets one tiny asyncio HTTP/1.1 server
on 127.0.0.1 (port chosen by the OS), in the simulator's process, answering:

- ``GET /v1/models`` and ``GET /health``
- ``POST /v1/chat/completions`` (also streamed as SSE, with a final usage
  chunk when ``stream_options.include_usage`` is set)
- ``POST /v1/completions`` and ``POST /v1/embeddings``

Answers are deterministic — the same request always gets the same text and
token counts — and carry ``usage`` as a real engine's do, so the gateway's
metering can be checked against them. Tokens are counted as words.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import time
from dataclasses import dataclass, field
from typing import Any

WORDS = [
    "the",
    "fleet",
    "answers",
    "every",
    "request",
    "it",
    "can",
    "place",
    "on",
    "a",
    "ready",
    "replica",
    "while",
    "the",
    "scheduler",
    "keeps",
    "the",
    "rest",
    "waiting",
    "with",
    "reasons",
    "an",
    "operator",
    "can",
    "read",
]
DEFAULT_MAX_TOKENS = 16
EMBEDDING_DIM = 8
MAX_BODY = 4 * 1024 * 1024


def count_tokens(text: str) -> int:
    return len(text.split())


def reply_words(seed: str, n: int) -> list[str]:
    start = int(hashlib.sha256(seed.encode()).hexdigest(), 16) % len(WORDS)
    return [WORDS[(start + i) % len(WORDS)] for i in range(n)]


def _prompt_text(body: dict) -> str:
    if isinstance(body.get("messages"), list):
        parts = []
        for m in body["messages"]:
            content = m.get("content") if isinstance(m, dict) else None
            if isinstance(content, str):
                parts.append(content)
            elif isinstance(content, list):
                parts += [c.get("text", "") for c in content if isinstance(c, dict)]
        return "\n".join(parts)
    prompt = body.get("prompt", "")
    return prompt if isinstance(prompt, str) else " ".join(map(str, prompt))


def _max_tokens(body: dict) -> int:
    value = body.get("max_tokens") or body.get("max_completion_tokens") or DEFAULT_MAX_TOKENS
    return max(1, min(int(value), 256)) if isinstance(value, int) else DEFAULT_MAX_TOKENS


@dataclass
class FakeEngine:
    """One simulated engine serving ``model``; ``endpoint`` once started."""

    model: str
    name: str = "sim"
    server: asyncio.base_events.Server | None = None
    port: int = 0
    requests: int = 0
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._connection, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.server.wait_closed(), 2)
            self.server = None

    # --- HTTP/1.1, just enough ----------------------------------------------------

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                request = await _read_request(reader)
                if request is None:
                    break
                method, path, body = request
                keep_open = await self._handle(method, path, body, writer)
                if not keep_open:
                    break
        except (ConnectionError, asyncio.IncompleteReadError, ValueError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _handle(self, method: str, path: str, raw: bytes, writer: asyncio.StreamWriter) -> bool:
        """Answer one request; False when the connection must close (after a stream)."""
        self.requests += 1
        path = path.split("?", 1)[0]
        if method == "GET" and path in ("/health", "/healthz"):
            return await _json(writer, 200, {"status": "ok"})
        if method == "GET" and path == "/v1/models":
            model = {"id": self.model, "object": "model", "created": self.created, "owned_by": "llmgw-sim"}
            return await _json(writer, 200, {"object": "list", "data": [model]})
        if method != "POST":
            return await _json(writer, 404, {"error": {"message": f"no route for {method} {path}"}})
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            return await _json(writer, 400, {"error": {"message": "the body is not JSON"}})
        if not isinstance(body, dict):
            return await _json(writer, 400, {"error": {"message": "the body must be a JSON object"}})
        if path == "/v1/chat/completions":
            if body.get("stream"):
                await self._stream_chat(body, writer)
                return False
            return await _json(writer, 200, self.chat(body))
        if path == "/v1/completions":
            return await _json(writer, 200, self.completion(body))
        if path == "/v1/embeddings":
            return await _json(writer, 200, self.embeddings(body))
        return await _json(writer, 404, {"error": {"message": f"no route for POST {path}"}})

    # --- the answers --------------------------------------------------------------

    def _generate(self, body: dict) -> tuple[str, list[str], dict]:
        prompt = _prompt_text(body)
        words = reply_words(prompt, _max_tokens(body))
        usage = {
            "prompt_tokens": count_tokens(prompt),
            "completion_tokens": len(words),
            "total_tokens": count_tokens(prompt) + len(words),
        }
        ident = hashlib.sha256(f"{self.model}/{prompt}".encode()).hexdigest()[:24]
        return ident, words, usage

    def chat(self, body: dict) -> dict:
        ident, words, usage = self._generate(body)
        return {
            "id": f"chatcmpl-{ident}",
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": " ".join(words)}, "finish_reason": "length"}
            ],
            "usage": usage,
        }

    def completion(self, body: dict) -> dict:
        ident, words, usage = self._generate(body)
        return {
            "id": f"cmpl-{ident}",
            "object": "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "text": " ".join(words), "finish_reason": "length"}],
            "usage": usage,
        }

    def embeddings(self, body: dict) -> dict:
        inputs = body.get("input", "")
        items = inputs if isinstance(inputs, list) else [inputs]
        data, tokens = [], 0
        for i, item in enumerate(items):
            text = item if isinstance(item, str) else json.dumps(item)
            tokens += count_tokens(text)
            digest = hashlib.sha256(text.encode()).digest()
            vector = [round(b / 255 - 0.5, 4) for b in digest[:EMBEDDING_DIM]]
            data.append({"object": "embedding", "index": i, "embedding": vector})
        return {
            "object": "list",
            "model": self.model,
            "data": data,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }

    async def _stream_chat(self, body: dict, writer: asyncio.StreamWriter) -> None:
        ident, words, usage = self._generate(body)
        head = (
            "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nConnection: close\r\n\r\n"
        )
        writer.write(head.encode())

        def chunk(delta: dict, finish: str | None = None, **extra: Any) -> bytes:
            choices = [{"index": 0, "delta": delta, "finish_reason": finish}]
            event = {
                "id": f"chatcmpl-{ident}",
                "object": "chat.completion.chunk",
                "created": self.created,
                "model": self.model,
                "choices": choices,
                **extra,
            }
            return f"data: {json.dumps(event)}\n\n".encode()

        writer.write(chunk({"role": "assistant", "content": ""}))
        for i, word in enumerate(words):
            writer.write(chunk({"content": word if i == 0 else " " + word}))
            await writer.drain()
        writer.write(chunk({}, "length"))
        options = body.get("stream_options")
        if isinstance(options, dict) and options.get("include_usage"):
            event = {
                "id": f"chatcmpl-{ident}",
                "object": "chat.completion.chunk",
                "created": self.created,
                "model": self.model,
                "choices": [],
                "usage": usage,
            }
            writer.write(f"data: {json.dumps(event)}\n\n".encode())
        writer.write(b"data: [DONE]\n\n")
        await writer.drain()


async def _read_request(reader: asyncio.StreamReader) -> tuple[str, str, bytes] | None:
    line = await reader.readline()
    if not line:
        return None
    parts = line.decode("latin-1").split()
    if len(parts) < 2:
        raise ValueError("bad request line")
    method, path = parts[0].upper(), parts[1]
    length = 0
    while True:
        header = await reader.readline()
        if header in (b"\r\n", b"\n", b""):
            break
        name, _, value = header.decode("latin-1").partition(":")
        if name.strip().lower() == "content-length":
            length = int(value.strip())
    if length > MAX_BODY:
        raise ValueError("body too large")
    body = await reader.readexactly(length) if length else b""
    return method, path, body


async def _json(writer: asyncio.StreamWriter, status: int, data: dict) -> bool:
    body = json.dumps(data).encode()
    reason = {200: "OK", 400: "Bad Request", 404: "Not Found"}.get(status, "OK")
    head = f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    writer.write(head.encode() + body)
    await writer.drain()
    return True


# --- a simulated node's shards ------------------------------------------------------------


@dataclass
class SimShard:
    id: str
    replica: str
    rank: int
    model: str
    state: str = "starting"
    engine: FakeEngine | None = None
    task: asyncio.Task | None = None

    def status(self) -> dict:
        out = {"id": self.id, "replica": self.replica, "rank": self.rank, "state": self.state}
        if self.engine is not None and self.state == "ready":
            out["endpoint"] = self.engine.endpoint
        return out


class SimShards:
    """What a simulated node runs: the same ``apply``/``status`` as the real supervisor, with fake engines.

    A shard "loads" for ``start_delay_s`` and is then ready; rank 0 serves the
    API, other ranks of a multi-node replica just report ready.
    """

    def __init__(self, start_delay_s: float = 0.2) -> None:
        self.start_delay_s = start_delay_s
        self.shards: dict[str, SimShard] = {}

    def apply(self, assignments: list[dict]) -> None:
        wanted = {str(a.get("id")): a for a in assignments if isinstance(a, dict) and a.get("id")}
        for shard_id in list(self.shards):
            if shard_id not in wanted:
                self._stop(self.shards.pop(shard_id))
        for shard_id, a in wanted.items():
            if shard_id not in self.shards:
                shard = SimShard(shard_id, str(a.get("replica")), int(a.get("rank") or 0), str(a.get("model")))
                self.shards[shard_id] = shard
                shard.task = asyncio.create_task(self._start(shard), name=f"sim-shard:{shard_id}")

    def status(self) -> list[dict]:
        return [s.status() for s in self.shards.values()]

    async def _start(self, shard: SimShard) -> None:
        await asyncio.sleep(self.start_delay_s)
        if shard.rank == 0:
            shard.engine = FakeEngine(shard.model, name=shard.id)
            await shard.engine.start()
        shard.state = "ready"

    def _stop(self, shard: SimShard) -> None:
        if shard.task is not None:
            shard.task.cancel()
        if shard.engine is not None:
            asyncio.create_task(shard.engine.stop())  # noqa: RUF006 - fire and forget; closing a listener

    async def close(self) -> None:
        for shard in self.shards.values():
            if shard.task is not None:
                shard.task.cancel()
            if shard.engine is not None:
                await shard.engine.stop()
        self.shards.clear()


def main(argv: list[str] | None = None) -> int:
    """``python -m agent.simulator.engine --model NAME --port P``: one fake engine, until killed."""
    import argparse

    parser = argparse.ArgumentParser(description="A fake OpenAI-compatible engine.")
    parser.add_argument("--model", required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)

    async def serve() -> None:
        engine = FakeEngine(args.model)
        engine.server = await asyncio.start_server(engine._connection, "127.0.0.1", args.port)
        engine.port = args.port
        print(f"fake engine for {args.model} on {engine.endpoint}", flush=True)
        await engine.server.serve_forever()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
