"""Django's ASGI handler with the middleware chain run as one synchronous call: one thread hop a request.

Django's own ASGIHandler runs the chain in async mode. Every middleware
built on ``MiddlewareMixin`` (Django's, django-prometheus's) then hands each
``process_request`` and ``process_response`` to the request's thread and
back, one ``sync_to_async`` each; a sync-only middleware in the chain adds an
``async_to_sync`` back to the event loop, and the sync view one more hop to
the thread. With our ten middlewares that was some twenty hand-overs
between the event loop and the request's thread for every request, each a
lock, a wake-up and a few Python frames on both sides: in ``llmgw serve``
a node's registration cost the admin process 10.7 ms of CPU, of which the
view itself was 4.6 (bench/scale.py, bench/register_cost.py). Nothing on
the admin listener needs the async chain: its views are synchronous, and a
streamed answer (api.base.streamed_list) is an async iterator the server
consumes after the chain has returned, as before.

So here the chain is loaded in sync mode, and a request crosses to its
thread once for the whole of it (middleware, view, middleware). What each
middleware and view sees is unchanged: the same request, in the same
thread Django gives the request (one per request, as under Django's own
handler), the same response, and an exception turned into a response by
the same middleware (core.errors.DatabaseDownMiddleware's 503 among them).
An ``async def`` view still works, through one ``async_to_sync`` of Django's.
tests/test_django_handler.py holds this.
"""

from __future__ import annotations

import django
from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIHandler


class SyncChainASGIHandler(ASGIHandler):
    """An ASGIHandler whose middleware chain and view run in one call on the request's thread."""

    def load_middleware(self, is_async: bool = False) -> None:
        # ASGIHandler asks for the async chain; the sync one is the same middleware, called directly.
        super().load_middleware(is_async=False)

    async def get_response_async(self, request):
        # thread_sensitive: the thread Django's ASGIHandler gives this request (its ThreadSensitiveContext),
        # where the view's database connection lives and where a streamed answer reads its pages.
        return await sync_to_async(self.get_response, thread_sensitive=True)(request)


def get_asgi_application() -> SyncChainASGIHandler:
    """django.core.asgi.get_asgi_application, with this handler."""
    django.setup(set_prefix=False)
    return SyncChainASGIHandler()
