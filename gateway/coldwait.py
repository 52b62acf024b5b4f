"""A streaming request that waits for a cold start: kept alive with SSE comments, ended in its protocol's error.

Once a ``200`` and its first comment have gone out, the status line cannot
become a ``503``. So the gateway commits late (gateway/proxy.py):

- it answers ``503`` with ``Retry-After`` up front when the measured
  estimate already says the start will outlast the wait;
- it sends nothing for the first keepalive interval, so a replica that is
  ready by then is answered as if nothing had waited (the engine's own
  status and headers);
- only then does it commit: ``200``, ``text/event-stream``, and a comment
  line (``: waiting for …``) every keepalive interval, which every SSE
  client skips;
- a committed stream that still cannot be served (the wait passes its bound,
  every replica fails, the engine refuses) ends with the protocol's own
  error event, and the engine's answer that does come is relayed as the
  rest of the stream.

:class:`ColdStream` is the committed stream; its ``send`` is handed to the
relay in place of the ASGI ``send``.

:class:`Waiters` bounds how many requests one key, and one team, may hold
waiting for a cold start: a waiting request is demand (it starts a
replica, and the autoscaler counts it), and what it costs its key is only
the tokens it is finally served, so without a bound one key could make the
fleet start every replica a model may have for the price of nothing.
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from collections import Counter
from dataclasses import dataclass, field

from core import outage
from gateway import anthropic, errors
from gateway.rules import Caller

log = logging.getLogger("llmgw.gateway")


def error_event(endpoint: str, refusal: errors.Refused) -> bytes:
    """``refusal`` as the error event of ``endpoint``'s stream.

    Chat and completions: a ``data:`` line with OpenAI's error object, which
    the official clients raise as an APIError. Messages: Anthropic's
    ``event: error``. Responses: the Responses API's ``error`` event.
    """
    if endpoint == "messages":
        return b"event: error\ndata: " + anthropic.error_body(refusal.status, refusal.message) + b"\n\n"
    if endpoint == "responses":
        data = {"type": "error", "code": refusal.code, "message": refusal.message, "param": None}
        return b"event: error\ndata: " + json.dumps(data).encode() + b"\n\n"
    return b"data: " + refusal.body() + b"\n\n"


def comment(text: str) -> bytes:
    """One SSE comment line (clients ignore it), ``text`` on one line."""
    return b": " + " ".join(text.split()).encode() + b"\n\n"


class ColdStream:
    """The response of a streaming request committed while it waits for a replica."""

    def __init__(self, endpoint: str, model: str, send) -> None:
        self.endpoint = endpoint
        self.model = model
        self._send = send
        self.committed = False
        self.ended = False
        self._status = 200
        self._held = bytearray()
        self._passing = True

    async def commit(self) -> None:
        headers = [
            (b"content-type", b"text/event-stream"),
            (b"cache-control", b"no-cache"),
            (b"x-llmgw-model", self.model.encode()),
        ]
        await self._send({"type": "http.response.start", "status": 200, "headers": headers})
        self.committed = True

    async def comment(self, text: str) -> None:
        await self._send({"type": "http.response.body", "body": comment(text), "more_body": True})

    async def fail(self, refusal: errors.Refused) -> None:
        """End the committed stream with ``refusal`` as its protocol's error event."""
        if self.ended:
            return
        self.ended = True
        await self._send(
            {"type": "http.response.body", "body": error_event(self.endpoint, refusal), "more_body": False}
        )

    async def send(self, message: dict) -> None:
        """The relay's ASGI messages, onto the committed stream.

        Its status line is dropped (ours went out). A stream is passed on as
        it comes; anything else (an engine's refusal, a plain JSON answer) is
        read whole and ends the stream as an error event with its message.
        """
        if message["type"] == "http.response.start":
            self._status = message["status"]
            content_type = dict(message.get("headers") or []).get(b"content-type", b"")
            self._passing = self._status < 400 and content_type.startswith(b"text/event-stream")
            return
        if self._passing:
            if not message.get("more_body", False):
                self.ended = True
            await self._send(message)
            return
        self._held += message.get("body", b"")
        if message.get("more_body", False):
            return
        await self.fail(_engine_refusal(self._status, bytes(self._held)))


def _engine_refusal(status: int, data: bytes) -> errors.Refused:
    message = errors.engine_message(data)
    code = "engine_refused" if status >= 400 else "not_a_stream"
    return errors.Refused(status if status >= 400 else 502, f"the engine answered: {message}", "upstream_error", code)


# --- how many requests one key or team may hold waiting ------------------------------------

# KEYS: one sorted set per scope (key, then team), members a request's token scored by when it
# lapses (ms). ARGV: now (ms), lapse (ms), the token, then each scope's cap.
# Returns 0 when the request is counted on every scope, else the 1-based index of the full one.
TAKE_LUA = """
local now = tonumber(ARGV[1])
for i = 1, #KEYS do
  redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', now)
  if redis.call('ZCARD', KEYS[i]) >= tonumber(ARGV[3 + i]) then return i end
end
for i = 1, #KEYS do
  redis.call('ZADD', KEYS[i], tonumber(ARGV[2]), ARGV[3])
  redis.call('PEXPIRE', KEYS[i], tonumber(ARGV[2]) - now)
end
return 0
"""


@dataclass(frozen=True)
class Cap:
    """One scope's bound: ``key:<id>`` or ``team:<id>``, named in the refusal as ``label``."""

    scope: str
    label: str
    limit: int


def caps(caller: Caller, per_key: int, per_team: int) -> list[Cap]:
    """The bounds over ``caller``'s waiting requests: its key's, then its team's."""
    return [Cap(f"key:{caller.key_id}", "key", per_key), Cap(f"team:{caller.team_id}", "team", per_team)]


def refusal(cap: Cap, model: str) -> errors.Refused:
    """The 429 of a request past ``cap``: it is not counted as demand and costs nothing."""
    return errors.Refused(
        429,
        f"this {cap.label} already has {cap.limit} requests waiting for a model to start "
        f"(LLMGW_COLD_WAIT_PER_{cap.label.upper()}); {model!r} is not started for more: retry once it is ready",
        "rate_limit_error",
        "cold_wait_limit",
        5,
    )


@dataclass
class Slot:
    """One request's place among its key's and team's waiting requests; ``refused`` when there was none."""

    caps: list[Cap]
    token: str
    refused: errors.Refused | None = None
    shared: bool = False
    """Counted in Redis (every gateway process sees it), not only in this process."""
    released: bool = field(default=False)


class Waiters:
    """Counts each key's and team's requests waiting for a cold start, refusing one past its cap.

    Shared by every gateway process through Redis when the gateway has it
    (one Lua call, atomic; a member lapses after ``lapse_s`` should its
    process die holding it); counted in this process alone when Redis is not
    configured or does not answer, so the cap then holds per process.
    """

    def __init__(self, per_key: int, per_team: int, lapse_s: float, redis=None) -> None:
        self.per_key = per_key
        self.per_team = per_team
        self.lapse_s = lapse_s
        self.redis = redis
        self._script = redis.register_script(TAKE_LUA) if redis is not None else None
        self.local: Counter[str] = Counter()

    async def take(self, caller: Caller, model: str) -> Slot:
        """A place for one more waiting request of ``caller``, or the refusal when its key or team is full."""
        slot = Slot(caps(caller, self.per_key, self.per_team), secrets.token_hex(8))
        if self._script is not None:
            try:
                full = await self._take_shared(slot)
            except Exception as exc:  # noqa: BLE001 - any Redis failure: counted in this process
                outage.redis.failed(exc)
            else:
                outage.redis.back()
                slot.shared = True
                slot.refused = refusal(slot.caps[full - 1], model) if full else None
                return slot
        # On the event loop, with no await between the check and the count: exact within the process.
        for cap in slot.caps:
            if self.local[cap.scope] >= cap.limit:
                slot.refused = refusal(cap, model)
                return slot
        for cap in slot.caps:
            self.local[cap.scope] += 1
        return slot

    async def _take_shared(self, slot: Slot) -> int:
        now = int(time.time() * 1000)
        keys = [_rkey(c.scope) for c in slot.caps]
        args = [now, now + int(self.lapse_s * 1000), slot.token, *[c.limit for c in slot.caps]]
        return int(await self._script(keys=keys, args=args))

    def release(self, slot: Slot | None):
        """Give ``slot`` back (once); returns the Redis call to await, or None when there is nothing to wait for.

        The local count goes back at once, so a cancelled request cannot keep it.
        """
        if slot is None or slot.released or slot.refused is not None:
            return None
        slot.released = True
        if not slot.shared:
            for cap in slot.caps:
                self.local[cap.scope] -= 1
                if self.local[cap.scope] <= 0:
                    del self.local[cap.scope]
            return None
        return self._release_shared(slot)

    async def _release_shared(self, slot: Slot) -> None:
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                for cap in slot.caps:
                    pipe.zrem(_rkey(cap.scope), slot.token)
                await pipe.execute()
        except Exception as exc:  # noqa: BLE001 - it lapses by itself after lapse_s
            outage.redis.failed(exc)
            log.warning("gateway: a cold-start wait could not be given back (it lapses by itself): %s", exc)


def _rkey(scope: str) -> str:
    return f"llmgw:coldwait:{scope}"
