"""The ASGI application of a process that serves only the gateway listener.

``/v1/…`` goes to the gateway's own ASGI app (gateway.asgi), ``/healthz`` to
Django; every other path is a 404, as on the gateway listener of
``llmgw.asgi``. No Channels here: nothing on this listener is live. It
speaks the ASGI lifespan protocol, so a server that stops it (uvicorn,
daphne) lets the gateway write the usage it still holds.
"""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmgw.settings")

from llmgw.django_handler import get_asgi_application

django_app = get_asgi_application()

from core import tracing  # noqa: E402
from gateway.asgi import GatewayApp  # noqa: E402
from gateway.tracing import traced  # noqa: E402
from llmgw.listeners import ListenerRouter  # noqa: E402

# Each gateway process is a fresh interpreter (llmgw.gateway_server): its tracing is its own.
tracing.setup("llmgw-gateway")
gateway_app = GatewayApp()
listener = ListenerRouter(django_app, gateway_port=None, gateway_app=traced(gateway_app))


async def application(scope, receive, send):
    """The listener, and the ASGI lifespan: when the server stops, queued usage is written first."""
    if scope["type"] != "lifespan":
        return await listener(scope, receive, send)
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await gateway_app.close()
            await send({"type": "lifespan.shutdown.complete"})
            return
