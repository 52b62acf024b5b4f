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
"""

from __future__ import annotations

import json

from gateway import anthropic, errors


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
