"""The engine behind the suite's gateway: the tests' fake engine, refusing what a real one would refuse.

vLLM, SGLang and llama.cpp answer a body they cannot read with a 400 and a
message. The tests' fake engine trusts its bodies and drops the connection
on one it cannot read, which would make every garbage body look like the
gateway's 5xx; here it answers 400 instead, so what the suite counts is the
gateway's own doing.
"""

from __future__ import annotations

import asyncio
import json
import threading

from tests.gateway.fake_engine import Behaviour, FakeEngine, prompt_tokens


def problem(path: str, body: object) -> str | None:
    """Why an engine would refuse this body, or None."""
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
    except Exception as exc:  # noqa: BLE001 - whatever the fake engine would have died of is the refusal
        return f"the engine cannot read this request: {type(exc).__name__}: {exc}"
    return None


class StrictEngine(FakeEngine):
    async def _handle(self, method, path, raw, reader, writer) -> bool:
        if path.startswith("/v1/") and path != "/v1/models":
            try:
                why = problem(path, json.loads(raw or b"null"))
            except ValueError as exc:
                why = f"the body is not JSON: {exc}"
            if why:
                return self._json(writer, 400, {"object": "error", "message": why, "type": "BadRequestError"})
        return await super()._handle(method, path, raw, reader, writer)


class EngineThread:
    """A StrictEngine on an event loop of its own, for a server that runs in another process."""

    def __init__(self, behaviour: Behaviour | None = None) -> None:
        self.engine = StrictEngine(behaviour or Behaviour(tokens=4))
        self.engine.stats.keep_bodies = False
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(self.loop)
            self.loop.run_until_complete(self.engine.start())
            ready.set()
            self.loop.run_forever()

        self.thread = threading.Thread(target=run, name="hostile-engine", daemon=True)
        self.thread.start()
        assert ready.wait(10), "the engine did not start"

    @property
    def url(self) -> str:
        return self.engine.url

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
