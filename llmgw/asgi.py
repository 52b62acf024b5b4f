"""The ASGI application served by ``llmgw serve`` on both listeners."""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmgw.settings")

from channels.auth import AuthMiddlewareStack
from channels.routing import ProtocolTypeRouter, URLRouter
from django.conf import settings
from django.core.asgi import get_asgi_application

django_app = get_asgi_application()

from agentapi import fast  # noqa: E402
from core import tracing  # noqa: E402
from dashboard.routing import websocket_urlpatterns  # noqa: E402
from gateway.asgi import GatewayApp  # noqa: E402
from gateway.tracing import traced  # noqa: E402
from inventory.writes import heartbeats  # noqa: E402
from llmgw.listeners import ListenerRouter  # noqa: E402


class HeartbeatFastLane:
    """Light heartbeats and unchanged full reports answered here; everything else goes on to Django."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send):
        if fast.wants(scope):
            return await fast.heartbeat(scope, receive, send)
        if fast.wants_report(scope):
            return await fast.report(scope, receive, send, self.app)
        return await self.app(scope, receive, send)


tracing.setup("llmgw")
application = ListenerRouter(
    HeartbeatFastLane(
        ProtocolTypeRouter(
            {
                "http": django_app,
                "websocket": AuthMiddlewareStack(URLRouter(websocket_urlpatterns)),
            }
        )
    ),
    gateway_port=settings.LLMGW_GATEWAY_ADDR.port,
    gateway_app=traced(GatewayApp()),
)


def stopped() -> None:
    """What a server of this application does once it takes no more requests: write the heartbeats still queued."""
    heartbeats.stop_flusher()
