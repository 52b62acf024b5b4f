"""Two listeners, one application: the admin listener and the gateway listener.

Both are served by one ASGI process so that, in the embedded configuration,
live updates published by ingestion reach the websockets of the same process.
A request is told apart by the local port it arrived on. The gateway listener
answers ``/v1/…`` and ``/healthz`` and nothing else: every other path is a 404
there, and websockets are refused, so an API key holder never reaches the
admin, the API or the agent endpoints.
"""

from __future__ import annotations

from django.conf import settings

GATEWAY = "gateway"
ADMIN = "admin"
SCOPE_KEY = "llmgw.listener"


def gateway_path_allowed(path: str) -> bool:
    return path == "/healthz" or path == "/v1" or path.startswith("/v1/")


class ListenerRouter:
    """ASGI wrapper that tags each connection with its listener.

    ``gateway_app``, when given, serves ``/v1/…`` on the gateway listener
    directly, outside Django's request handling (see gateway.asgi); the
    admin listener never reaches it. ``gateway_port`` None: every connection
    is the gateway listener's (a process serving only that one, as
    ``llmgw serve``'s gateway processes do).
    """

    def __init__(self, app, gateway_port: int | None, gateway_app=None) -> None:
        self.app = app
        self.gateway_port = gateway_port
        self.gateway_app = gateway_app

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        server = scope.get("server") or (None, None)
        listener = GATEWAY if self.gateway_port is None or server[1] == self.gateway_port else ADMIN
        scope = {**scope, SCOPE_KEY: listener}
        if listener == GATEWAY:
            if scope["type"] == "websocket":
                await receive()
                return await send({"type": "websocket.close", "code": 4404})
            if not gateway_path_allowed(scope["path"]):
                return await _not_found(send)
            if self.gateway_app is not None and scope["type"] == "http" and scope["path"] != "/healthz":
                return await self.gateway_app(scope, receive, send)
        return await self.app(scope, receive, send)


async def _not_found(send) -> None:
    body = b'{"error": "not found: this listener serves /v1/ and /healthz only"}'
    await send(
        {
            "type": "http.response.start",
            "status": 404,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


class GatewayListenerMiddleware:
    """Routes gateway-listener requests through the gateway's URLconf."""

    def __init__(self, get_response) -> None:
        self.get_response = get_response

    def __call__(self, request):
        scope = getattr(request, "scope", None) or {}
        request.llmgw_listener = scope.get(SCOPE_KEY, ADMIN)
        if request.llmgw_listener == GATEWAY:
            request.urlconf = settings.GATEWAY_URLCONF
        return self.get_response(request)
