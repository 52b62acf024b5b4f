"""URLs of the gateway listener that Django serves: /healthz.

``/v1/…`` is served by gateway.asgi.GatewayApp, mounted ahead of Django in
llmgw.asgi (see there for why); nothing else is reachable on this listener.
"""

from django.urls import path

from observability.health import healthz

urlpatterns = [
    path("healthz", healthz, name="gateway-healthz"),
]
