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
middleware and view sees is unchanged: the same request, on one thread
for the whole request (its chain, view, streamed pages and close), the
same response, and an exception turned into a response by
the same middleware (core.errors.DatabaseDownMiddleware's 503 among them).
An ``async def`` view still works, through one ``async_to_sync`` of Django's.

And the request's thread is kept for a later request (:class:`RequestThreads`)
where Django starts one for every request and joins it at the end: 0.8 ms
of the admin process's CPU a registration (5.9 -> 5.1 ms, bench/scale.py at
3,000 nodes). Django keeps database connections per thread; each request
still closes (or hands back to the pool) what it opened as it finishes
(llmgw.asgi.close_the_requests_connections), so the next request on the
thread opens its own, as Django's threads do under WSGI. A thread whose
request ended while its view still runs (the client left) is not handed
to another until it is done: it ends once done.

tests/test_django_handler.py holds all of this.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor

import django
from asgiref.sync import ThreadSensitiveContext, sync_to_async
from django.core.handlers.asgi import ASGIHandler

# Idle request threads kept for the next requests; past this many (a burst's), a finished one ends.
IDLE_THREADS_KEPT = 32


class RequestThread(ThreadPoolExecutor):
    """One request's thread at a time, kept for the next: what Django's ThreadSensitiveContext makes and
    ends for every request (a thread started, waited for and joined each time)."""

    def __init__(self) -> None:
        super().__init__(max_workers=1, thread_name_prefix="llmgw-request")
        self._lock = threading.Lock()
        self._running = 0

    def submit(self, fn, /, *args, **kwargs) -> Future:
        with self._lock:
            self._running += 1
        try:
            future = super().submit(fn, *args, **kwargs)
        except BaseException:
            self._finished(None)  # never queued (the executor was shut down): nothing runs
            raise
        future.add_done_callback(self._finished)
        return future

    def _finished(self, _future: Future | None) -> None:
        with self._lock:
            self._running -= 1

    @property
    def idle(self) -> bool:
        """Nothing submitted is still to run or running (a request the client left may have left its view running)."""
        with self._lock:
            return self._running == 0


class RequestThreads:
    """The idle request threads of one handler: taken by a request, given back when it ends."""

    def __init__(self, keep: int = IDLE_THREADS_KEPT) -> None:
        self.keep = keep
        self._idle: list[RequestThread] = []
        self._lock = threading.Lock()

    def take(self) -> RequestThread:
        with self._lock:
            if self._idle:
                return self._idle.pop()
        return RequestThread()

    def give_back(self, thread: RequestThread) -> None:
        # Still busy (a view the client did not wait for): it ends once done, and the next request gets another.
        if thread.idle:
            with self._lock:
                if len(self._idle) < self.keep:
                    self._idle.append(thread)
                    return
        thread.shutdown(wait=False)


class SyncChainASGIHandler(ASGIHandler):
    """An ASGIHandler whose middleware chain and view run in one call on the request's thread."""

    def __init__(self) -> None:
        super().__init__()
        self.threads = RequestThreads()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            raise ValueError(f"Django can only handle ASGI/HTTP connections, not {scope['type']}.")
        thread = self.threads.take()
        try:
            # The request's thread-sensitive calls (the chain and view, closing the response, a streamed
            # answer's pages) all run on ``thread``, as on the one Django's own context would start.
            async with ThreadSensitiveContext(executor=thread):
                await self.handle(scope, receive, send)
        finally:
            self.threads.give_back(thread)

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
