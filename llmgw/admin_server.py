"""The admin listener's server: uvicorn with httptools on asyncio's loop, serving ``llmgw.asgi``.

``llmgw serve`` runs it in its own process when LLMGW_ADMIN_WORKERS is 1
(the default), or binds the admin socket and, as llmgw.supervisor, starts
that many of these processes on it (llmgw.listener_processes), with Redis as the channel layer
and PostgreSQL as the database (core.config refuses more than one
otherwise). The admin listener takes every node's heartbeats and
registrations: on a host with the cores for it, more processes take more of
them, as the gateway's processes do for inference. Nothing the listener
decides lives only in one process: a node's credential is checked against
the database (each process keeps its own short-lived cache of it, as each
control host does), each process queues and writes its own heartbeats, and
live pages hear every process's updates through Redis.

Why uvicorn, and why not uvloop (which the gateway's processes use):

- under daphne a heartbeat cost the serve process 0.79 ms of CPU at 2,000
  nodes, Twisted's HTTP handling most of it; under uvicorn 0.29 ms, and the
  heartbeat p99 fell from 81 to 3.8 ms (bench/scale.py);
- the live pages' channel layer is channels_redis, whose receive holds a
  per-process lock while it waits in a blocking read on Redis. When Redis
  came back after an outage, channels cancelled a page's receive that had
  met a dead pooled connection, and under uvloop that cancelled read never
  finished: the lock stayed held and every page of the process went deaf
  (tests/deploy/test_multihost.py::test_redis_stopped_under_load failed 2 of
  3 runs). Under asyncio's loop the read ends on the cancel; the heartbeats
  lose nothing measurable by it.

Websockets are served by the ``websockets`` library's sans-I/O protocol.
HTTP is uvicorn's httptools protocol, save that a known node's plain
heartbeat is answered inside it, not as an ASGI request
(llmgw.admin_protocol).

Each process lends its requests PostgreSQL connections from a pool of its
own (core.dbpool), LLMGW_ADMIN_DB_CONNECTIONS at most.
"""

from __future__ import annotations

import os
import signal
import socket
import sys

from core import config, dbpool
from llmgw.listener_processes import GRACEFUL_S, inherited_socket


def serve(*, host: str | None = None, port: int | None = None, sock: socket.socket | None = None) -> None:
    """Serve the admin listener on ``host:port`` or an inherited ``sock`` until SIGTERM or SIGINT.

    Then the heartbeats this process queued are written, before it ends.
    """
    import uvicorn

    # Before llmgw.asgi sets Django up: no connection of this process's is open yet (in llmgw serve's
    # own process, serve.main did this before its first).
    dbpool.pool_this_process(config.admin_db_connections(os.environ))
    from llmgw import asgi  # first: it sets Django up, which the protocol's imports need
    from llmgw.admin_protocol import AdminHttpProtocol
    from llmgw.listener_protocol import serving

    bind = {"host": host, "port": port} if sock is None else {}
    server = uvicorn.Server(
        uvicorn.Config(
            asgi.application,
            **bind,
            # httptools, bounded (llmgw.listener_protocol), with a known node's heartbeat answered inline
            http=serving(AdminHttpProtocol, config.listener_limits(os.environ)),
            ws="websockets-sansio",
            loop="asyncio",  # not uvloop: see above
            # Channels' router takes http and websocket scopes only; start and stop are this function's.
            lifespan="off",
            access_log=False,
            log_level="warning",
            server_header=False,
            # As under daphne before: the client is the socket's peer, whatever X-Forwarded-For a request carries.
            proxy_headers=False,
            timeout_graceful_shutdown=GRACEFUL_S,
        )
    )
    # uvicorn hands each signal it caught back to the handler it found once it has stopped. Found
    # SIGTERM's default, that would end this process before the queued beats are written (and, in
    # llmgw serve, before the gateway and worker are stopped); a handler that does nothing lets the
    # caller finish instead.
    previous = signal.signal(signal.SIGTERM, lambda *_: None)
    try:
        server.run(sockets=None if sock is None else [sock])
    except KeyboardInterrupt:
        pass  # SIGINT, handed back the same way: the stop was clean
    finally:
        signal.signal(signal.SIGTERM, previous)
        # uvicorn has stopped taking requests: the beats it queued are written before this process ends.
        asgi.stopped()


def main(argv: list[str] | None = None) -> int:
    """One of LLMGW_ADMIN_WORKERS processes, on the socket llmgw serve bound."""
    sock = inherited_socket("llmgw.admin_server", argv)
    if sock is None:
        return 0
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmgw.settings")
    serve(sock=sock)
    return 0


if __name__ == "__main__":
    sys.exit(main())
