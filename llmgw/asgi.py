"""The ASGI application served by ``llmgw serve`` on both listeners."""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmgw.settings")

from channels.auth import AuthMiddlewareStack
from channels.routing import ProtocolTypeRouter, URLRouter
from django.conf import settings
from django.core.signals import request_finished
from django.db import connections

from llmgw.django_handler import get_asgi_application

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


def close_the_requests_connections(**_) -> None:
    """Close the database connections a request opened, as it finishes.

    Under Django's own ASGI handler each request's synchronous code ran on a
    thread of its own, and a connection belongs to the thread that opened it:
    the next request never reused it, whatever CONN_MAX_AGE says (Django's
    docs ask for persistent connections off under ASGI). Our handler keeps
    request threads for later requests (llmgw.django_handler), and each
    request still ends its own connections here. Left open, each lingered
    until the garbage collector reached it, and a registration storm at
    10,000 nodes held enough of them to meet PostgreSQL's max_connections
    (registrations refused with 503 "too many clients already",
    bench/scale.py). In a process that pools its connections (core.dbpool:
    the admin listener's, on PostgreSQL) closing hands the connection back to
    the pool for the next request instead. Threads that live on send no
    request_finished: the heartbeat flusher closes its own each flush, the
    fast lane's lookups hand theirs back (core.dbpool.give_back), the
    gateway's keep theirs.
    A connection inside a transaction is left alone (a test's, or a caller
    that owns it).
    """
    for conn in connections.all(initialized_only=True):
        if not conn.in_atomic_block:
            conn.close()


# Only where this module is the application: a server of it, not the test client.
request_finished.connect(close_the_requests_connections, dispatch_uid="llmgw.asgi.close_the_requests_connections")

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
