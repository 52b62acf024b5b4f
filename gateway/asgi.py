"""The gateway listener's ``/v1/…`` as a plain ASGI application.

Plain ASGI rather than Django views: Django's handler runs every request
through the whole middleware stack, and with sync middleware in it (ours
and django-prometheus's) each request hops to a thread and back, which
costs more than everything else the gateway does. This app also sees the
client's ``http.disconnect`` itself and cancels the request, which closes
the upstream connection so the engine stops generating. Django is still
used for the ORM, on the gateway's own threads.

``/healthz`` on the gateway listener stays a Django view.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import logging

from core import errors as core_errors
from core.credentials import bearer_secret
from gateway import anthropic, conf, errors
from gateway.proxy import ENDPOINTS, Gateway

log = logging.getLogger("llmgw.gateway")
# The database cannot be reached: through the ORM's threads, or on the loop (gateway.pgpath).
DATABASE_DOWN = core_errors.DATABASE_DOWN
JSON = [(b"content-type", b"application/json")]


def _bearer(headers: list[tuple[bytes, bytes]]) -> str:
    """The client's key: ``Authorization: Bearer KEY``, or ``x-api-key: KEY`` as Anthropic's clients send it."""
    for name, value in headers:
        if name == b"authorization":
            return bearer_secret(value.decode("latin-1")) or ""
    for name, value in headers:
        if name == b"x-api-key":
            return value.decode("latin-1").strip()
    return ""


def _error(path: str, refusal: errors.Refused) -> bytes:
    """A refusal in the error shape of the protocol the client speaks on ``path``."""
    if path == "/v1/messages":
        return anthropic.error_body(refusal.status, refusal.message)
    return refusal.body()


def _content_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    for name, value in headers:
        if name == b"content-length":
            with contextlib.suppress(ValueError):
                return int(value)
    return None


async def _read_body(receive, limit: int) -> bytes | None:
    """The request body; None when the client went away first."""
    body = bytearray()
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        body += message.get("body", b"")
        if len(body) > limit:
            raise errors.too_large(limit)
        if not message.get("more_body"):
            return bytes(body)


async def _answer(send, status: int, body: bytes, retry_after_s: int | None = None) -> None:
    headers = [*JSON, (b"content-length", str(len(body)).encode())]
    if retry_after_s is not None:
        headers.append((b"retry-after", str(retry_after_s).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _until_disconnect(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


class GatewayApp:
    """ASGI app for ``/v1/…``; the Gateway behind it is made on the first request, in the server's loop."""

    def __init__(self, gateway_factory=None) -> None:
        self.gateway_factory = gateway_factory or _default_gateway
        self.gateway: Gateway | None = None

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        if self.gateway is None:
            self.gateway = self.gateway_factory()
        started = False

        async def tracked_send(message):
            nonlocal started
            started = True
            await send(message)

        try:
            await self._dispatch(scope, receive, tracked_send)
        except errors.Refused as refusal:
            if not started:
                await _answer(send, refusal.status, _error(scope.get("path", ""), refusal), refusal.retry_after_s)
        except DATABASE_DOWN as exc:
            detail = core_errors.first_line(exc)
            log.warning(
                "gateway: %s %s: the database did not answer: %s", scope.get("method"), scope.get("path"), detail
            )
            if not started:
                refusal = errors.database_unavailable(detail)
                await _answer(send, 503, _error(scope.get("path", ""), refusal), core_errors.DATABASE_RETRY_AFTER_S)
        except Exception:
            log.exception("gateway: %s %s failed", scope.get("method"), scope.get("path"))
            if not started:
                failed = errors.Refused(
                    500, "the gateway failed on this request; it is logged", "server_error", "internal"
                )
                await _answer(send, 500, _error(scope.get("path", ""), failed))

    async def close(self) -> None:
        """Write the usage still queued and close connections: the server is stopping."""
        if self.gateway is not None:
            await self.gateway.close()
            self.gateway = None

    async def _dispatch(self, scope, receive, send) -> None:
        method, path = scope["method"], scope["path"]
        endpoint = path.removeprefix("/v1/")
        headers = scope.get("headers", [])
        if method == "GET" and endpoint == "models":
            answer = await self.gateway.models(_bearer(headers))
            return await _answer(send, 200, json.dumps(answer).encode())
        if endpoint not in ENDPOINTS:
            raise errors.not_found(path)
        if method != "POST":
            raise errors.Refused(405, f"{path} takes POST", "invalid_request_error", "method_not_allowed")
        limit = self.gateway.conf.max_body_bytes
        length = _content_length(headers)
        if length is not None and length > limit:
            raise errors.too_large(limit)
        raw = await _read_body(receive, limit)
        if raw is None:
            return
        work = asyncio.ensure_future(self.gateway.complete(endpoint, raw, _bearer(headers), send))
        gone = asyncio.ensure_future(_until_disconnect(receive))
        try:
            await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not work.done():
                # The client went away (or this request is being torn down):
                # cancelling closes the upstream request; usage is still recorded.
                work.cancel()
            gone.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await work


def _default_gateway() -> Gateway:
    redis = None
    from django.conf import settings

    if settings.LLMGW_REDIS_URL:
        import redis.asyncio as aioredis

        redis = aioredis.from_url(settings.LLMGW_REDIS_URL, socket_timeout=1.0, socket_connect_timeout=1.0)
    gateway = Gateway(conf.get(), redis)
    atexit.register(gateway.writer.flush_now)
    return gateway
