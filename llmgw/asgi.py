"""The ASGI application served by ``llmgw serve`` on both listeners."""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmgw.settings")

from channels.auth import AuthMiddlewareStack
from channels.routing import ProtocolTypeRouter, URLRouter
from django.conf import settings
from django.core.asgi import get_asgi_application

django_app = get_asgi_application()

from dashboard.routing import websocket_urlpatterns  # noqa: E402
from gateway.asgi import GatewayApp  # noqa: E402
from llmgw.listeners import ListenerRouter  # noqa: E402

application = ListenerRouter(
    ProtocolTypeRouter(
        {
            "http": django_app,
            "websocket": AuthMiddlewareStack(URLRouter(websocket_urlpatterns)),
        }
    ),
    gateway_port=settings.LLMGW_GATEWAY_ADDR.port,
    gateway_app=GatewayApp(),
)
