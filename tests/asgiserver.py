"""``llmgw.asgi`` on a real socket, in a thread: what Django's live_server is, for the paths only ASGI serves.

Django's ``live_server`` runs WSGI, which never reaches the heartbeat's fast
lane (the path's only server). This runs uvicorn on the same application the
admin listener serves, on a free local port, for as long as the ``with``.
"""

from __future__ import annotations

import gc
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn

from llmgw.admin_protocol import AdminHttpProtocol
from llmgw.asgi import application


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def asgi_live_server(timeout_s: float = 10.0, app=None, http=None) -> Iterator[str]:
    """The server's base URL; the server is stopped, and its thread joined, on leaving.

    ``app``: another ASGI application than the admin listener's (the gateway's, say).
    ``http``: uvicorn's HTTP protocol; by default the admin listener's own
    (llmgw.admin_protocol) for the admin application, uvicorn's httptools for another.
    """
    with uvicorn_in_thread(timeout_s, app, http) as (_, url):
        yield url


@contextmanager
def uvicorn_in_thread(timeout_s: float = 10.0, app=None, http=None) -> Iterator[tuple[uvicorn.Server, str]]:
    """:func:`asgi_live_server`, with the ``uvicorn.Server`` beside the URL (its connections, say)."""
    port = _free_port()
    if http is None:
        http = AdminHttpProtocol if app is None else "httptools"
    # The admin listener's loop is asyncio's (llmgw.admin_server says why), whose executor ends with the loop.
    loop = "asyncio" if app is None else "auto"
    server = uvicorn.Server(
        uvicorn.Config(
            app or application, host="127.0.0.1", port=port, log_level="warning", lifespan="off", http=http, loop=loop
        )
    )
    thread = threading.Thread(target=server.run, name="asgi-live-server", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"uvicorn did not start on port {port}")
        time.sleep(0.02)
    try:
        yield server, f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout_s)
        # The connections of the server's threads (a credential the desk looked up, on the loop's
        # executor) ended with them; they are closed at the collector's next pass, now, before the test
        # database is dropped.
        gc.collect()
