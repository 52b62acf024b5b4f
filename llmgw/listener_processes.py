"""Child processes of ``llmgw serve`` that accept on the listening sockets it bound: the gateway's, the admin's.

``llmgw serve`` binds the sockets, then starts a number of processes that
each serve one (:func:`listen` says how the kernel spreads connections over
them), watches them and stops them. A process that dies is started again, after a pause
that grows while it keeps dying, so one bad start does not spin.

Each is a fresh interpreter (fork and exec, ``python -m <module> --fd N
--parent PID``): no thread, connection or exporter is ever shared across a
fork, and the child asks for its own death signal, so a ``llmgw serve``
killed outright takes its children with it.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time

log = logging.getLogger("llmgw.serve")
GRACEFUL_S = 5
"""Requests still running when a listener's process is asked to stop get this long to end (both listeners)."""
STOP_TIMEOUT_S = 15
"""How long a stopped process gets to end (its requests, then what it still holds) before it is killed."""
BACKLOG = 2048


def listen(host: str, port: int, count: int = 1) -> list[socket.socket]:
    """The listening sockets of ``count`` processes serving ``host:port``: one each on Linux, else one they share.

    On Linux each process gets its own socket, all bound to the address with
    SO_REUSEPORT, and the kernel hands each new connection to one of them by
    a hash of its addresses and ports: an even share, whoever is awake. On
    one shared socket every idle process is woken and the first takes every
    connection waiting (asyncio accepts until none is left), so a burst of
    connections opened at once, and kept (a load generator's or a pooling
    proxy's 32, a fleet's agents reconnecting after a restart), all went to
    one of two admin processes: it spent 0.40 ms a heartbeat while the other
    idled, and the p99 was 424 ms (bench/scale.py, 10,000 nodes).

    The price: a connection the kernel hashed to a process that has died
    waits in that socket's queue until its process is started again, where
    on a shared socket another process would have taken it. The socket
    stays open meanwhile (the parent holds it), so the connection is not
    refused.

    Another server already on the address is refused (EADDRINUSE) here, as
    it is without SO_REUSEPORT: the first bind has no SO_REUSEPORT and is
    only a probe, so the group never joins one that someone else started.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    grouped = count > 1 and sys.platform.startswith("linux") and hasattr(socket, "SO_REUSEPORT")
    if grouped:
        with _bound(family, host, port, reuse_port=False) as probe:
            port = probe.getsockname()[1]  # port 0 asked for any: the group shares the one the probe got
    socks: list[socket.socket] = []
    try:
        for _ in range(count if grouped else 1):
            sock = _bound(family, host, port, reuse_port=grouped)
            socks.append(sock)
            sock.listen(BACKLOG)
            sock.set_inheritable(True)
    except BaseException:
        for sock in socks:
            sock.close()
        raise
    return socks


def _bound(family: int, host: str, port: int, reuse_port: bool) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except BaseException:
        sock.close()
        raise
    return sock


class ListenerProcesses:
    """Start, watch and stop ``count`` processes running ``module`` on ``socks``; ``what`` names them in the log.

    ``socks`` is :func:`listen`'s: one a process (the i-th is always the
    i-th process's, and its replacement's), or one they all share.
    """

    def __init__(self, socks: list[socket.socket], count: int, module: str, what: str) -> None:
        if len(socks) not in (1, count):
            raise ValueError(f"{len(socks)} sockets for {count} {what} processes: one each, or one to share")
        self.socks = socks
        self.count = count
        self.module = module
        self.what = what
        self.procs: list[subprocess.Popen | None] = [None] * count
        self.started_at = [0.0] * count
        self._stopping = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name=f"{what}-watch", daemon=True)

    def _spawn(self, i: int) -> subprocess.Popen:
        fd = self.socks[i % len(self.socks)].fileno()
        # No preexec_fn: this runs from the watcher thread too, and code run
        # between fork and exec in a threaded process can deadlock. The child
        # asks for its own death signal.
        return subprocess.Popen(
            [sys.executable, "-m", self.module, "--fd", str(fd), "--parent", str(os.getpid())],
            pass_fds=(fd,),
        )

    def start(self) -> None:
        for i in range(self.count):
            self.procs[i], self.started_at[i] = self._spawn(i), time.monotonic()
        self._watcher.start()

    def pids(self) -> list[int]:
        """The processes running now."""
        return [p.pid for p in self.procs if p is not None and p.poll() is None]

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
                    "llmgw: %s process %d exited with %s; starting it again in %.1fs",
                    self.what,
                    proc.pid,
                    proc.returncode,
                    pause[i],
                )
                if self._stopping.wait(pause[i]):
                    return
                self.procs[i], self.started_at[i] = self._spawn(i), time.monotonic()

    def stop(self) -> None:
        """SIGTERM to each, a wait for all of them together, SIGKILL to those still running; then the sockets closed."""
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
        for sock in self.socks:
            sock.close()


def inherited_socket(module: str, argv: list[str] | None = None) -> socket.socket | None:
    """The child's side (``--fd``, ``--parent``): its death signal asked for, then the socket it inherited.

    None when llmgw serve ended before the death signal was asked for: the child has nothing to serve.
    """
    from llmgw.children import die_with_parent

    parser = argparse.ArgumentParser(prog=f"python -m {module}")
    parser.add_argument("--fd", type=int, required=True, help="the listening socket, inherited from llmgw serve")
    parser.add_argument("--parent", type=int, help="llmgw serve's pid: this process ends when it does")
    args = parser.parse_args(argv)
    if args.parent is not None:
        die_with_parent()
        if os.getppid() != args.parent:
            return None
    return socket.socket(fileno=args.fd)
