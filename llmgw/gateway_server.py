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

A gateway process that dies is started again, after a pause that grows while
it keeps dying, so one bad start does not spin.

Each process is a fresh interpreter (fork and exec), and sets up its own
tracing when it imports ``llmgw.asgi_gateway`` (core.tracing): an exporter's
thread and connection are never shared across a fork.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from llmgw.children import die_with_parent

log = logging.getLogger("llmgw.serve")
STOP_TIMEOUT_S = 15
# Requests still running when a stop is asked get this long to end.
GRACEFUL_S = 5
BACKLOG = 2048


def listen(host: str, port: int) -> socket.socket:
    """The gateway's listening socket, made here so that every worker accepts on the same one."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(BACKLOG)
    sock.set_inheritable(True)
    return sock


class GatewayProcesses:
    """Start, watch and stop the gateway's worker processes."""

    def __init__(self, sock: socket.socket, count: int) -> None:
        self.sock = sock
        self.count = count
        self.procs: list[subprocess.Popen | None] = [None] * count
        self.started_at = [0.0] * count
        self._stopping = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="gateway-watch", daemon=True)

    def _spawn(self) -> subprocess.Popen:
        fd = self.sock.fileno()
        # No preexec_fn: this runs from the watcher thread too, and code run
        # between fork and exec in a threaded process can deadlock. The child
        # asks for its own death signal (main, below).
        return subprocess.Popen(
            [sys.executable, "-m", "llmgw.gateway_server", "--fd", str(fd), "--parent", str(os.getpid())],
            pass_fds=(fd,),
        )

    def start(self) -> None:
        for i in range(self.count):
            self.procs[i], self.started_at[i] = self._spawn(), time.monotonic()
        self._watcher.start()

    def _watch(self) -> None:
        pause = [0.25] * self.count
        while not self._stopping.wait(0.5):
            for i, proc in enumerate(self.procs):
                if proc is None or proc.poll() is None or self._stopping.is_set():
                    continue
                # One that lived a while was healthy: it is started again at once.
                lived = time.monotonic() - self.started_at[i]
                pause[i] = 0.5 if lived > 60 else min(pause[i] * 2, 30.0)
                log.error(
                    "llmgw: gateway process %d exited with %s; starting it again in %.1fs",
                    proc.pid,
                    proc.returncode,
                    pause[i],
                )
                if self._stopping.wait(pause[i]):
                    return
                self.procs[i], self.started_at[i] = self._spawn(), time.monotonic()

    def stop(self) -> None:
        self._stopping.set()
        if self._watcher.is_alive():
            self._watcher.join(5)
        running = [p for p in self.procs if p is not None and p.poll() is None]
        for proc in running:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for proc in running:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.sock.close()


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
        http="httptools",
        # The lifespan's shutdown is where the gateway writes the usage it still holds.
        lifespan="on",
        access_log=False,
        log_level="warning",
        server_header=False,
        timeout_graceful_shutdown=GRACEFUL_S,
    )
    await uvicorn.Server(config).serve(sockets=[sock])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m llmgw.gateway_server")
    parser.add_argument("--fd", type=int, required=True, help="the listening socket, inherited from llmgw serve")
    parser.add_argument("--parent", type=int, help="llmgw serve's pid: this process ends when it does")
    args = parser.parse_args(argv)
    if args.parent is not None:
        die_with_parent()
        if os.getppid() != args.parent:
            return 0  # llmgw serve ended before the death signal was asked for
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmgw.settings")
    sock = socket.socket(fileno=args.fd)
    try:
        _event_loop_runner()(_serve(sock))
    except KeyboardInterrupt:
        # uvicorn hands a Ctrl-C back once it has stopped; the stop was clean.
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
