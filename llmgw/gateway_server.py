"""The gateway listener's processes: uvicorn, with uvloop and httptools, serving ``llmgw.asgi_gateway``.

``llmgw serve`` binds the gateway's socket itself, then starts
LLMGW_GATEWAY_WORKERS of these processes on it (the kernel hands each new
connection to one of them) while the serve process serves the admin listener. Why a
server of its own and processes of their own, measured with
``bench/gateway.py`` (docs/architecture.md has the figures):

- the same gateway app adds 0.3–0.9 ms more at p50 under daphne than under
  uvicorn with httptools and uvloop, and serves 27–43 % fewer requests per
  second: Twisted's HTTP handling and its hand-over to asyncio are the
  difference;
- a heartbeat storm on the admin listener cannot slow inference down, nor a
  burst of inference the heartbeats: each has its own processes and event
  loop, and the gateway scales past one core with more workers;
- the gateway needs nothing that only the serve process has: keys, budgets,
  rate limits and usage are all in the database (or Redis), so any number of
  its processes agree.

Its HTTP protocol is the listeners' bounded one (llmgw.listener_protocol),
which refuses in OpenAI's error shape here, as the gateway does.

llmgw.listener_processes starts, watches and stops them. Each process is a
fresh interpreter (fork and exec), and sets up its own
tracing when it imports ``llmgw.asgi_gateway`` (core.tracing): an exporter's
thread and connection are never shared across a fork.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys

from core.config import listener_limits
from gateway import errors
from llmgw.listener_processes import GRACEFUL_S, inherited_socket
from llmgw.listener_protocol import BoundedHttpProtocol, serving


class GatewayHttpProtocol(BoundedHttpProtocol):
    """The listeners' bounded protocol, refusing in the gateway's error shape (gateway.errors)."""

    def refusal_body(self, status: int, sentence: str, code: str) -> tuple[bytes, bytes]:
        kind = "service_unavailable" if status == 503 else "invalid_request_error"
        return b"application/json", errors.Refused(status, sentence, kind, code).body()


# --- one gateway process ---------------------------------------------------------


def _event_loop_runner():
    try:
        import uvloop
    except ImportError:  # not on this platform: asyncio's own loop works, only slower
        return asyncio.run
    return uvloop.run


async def _serve(sock: socket.socket) -> None:
    import uvicorn

    from llmgw.asgi_gateway import application

    config = uvicorn.Config(
        application,
        http=serving(GatewayHttpProtocol, listener_limits(os.environ)),
        # The lifespan's shutdown is where the gateway writes the usage it still holds.
        lifespan="on",
        access_log=False,
        log_level="warning",
        server_header=False,
        timeout_graceful_shutdown=GRACEFUL_S,
    )
    await uvicorn.Server(config).serve(sockets=[sock])


def main(argv: list[str] | None = None) -> int:
    sock = inherited_socket("llmgw.gateway_server", argv)
    if sock is None:
        return 0
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmgw.settings")
    try:
        _event_loop_runner()(_serve(sock))
    except KeyboardInterrupt:
        # uvicorn hands a Ctrl-C back once it has stopped; the stop was clean.
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
