"""Child processes of ``llmgw serve`` that accept on one listening socket it bound: the gateway's, the admin's.

``llmgw serve`` binds the socket, then starts a number of processes that
each serve it (the kernel hands each new connection to one of them), watches
them and stops them. A process that dies is started again, after a pause
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


def listen(host: str, port: int) -> socket.socket:
    """A listening socket the children inherit, so that every one of them accepts on the same one."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(BACKLOG)
    sock.set_inheritable(True)
    return sock


class ListenerProcesses:
    """Start, watch and stop ``count`` processes running ``module`` on ``sock``; ``what`` names them in the log."""

    def __init__(self, sock: socket.socket, count: int, module: str, what: str) -> None:
        self.sock = sock
        self.count = count
        self.module = module
        self.what = what
        self.procs: list[subprocess.Popen | None] = [None] * count
        self.started_at = [0.0] * count
        self._stopping = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name=f"{what}-watch", daemon=True)

    def _spawn(self) -> subprocess.Popen:
        fd = self.sock.fileno()
        # No preexec_fn: this runs from the watcher thread too, and code run
        # between fork and exec in a threaded process can deadlock. The child
        # asks for its own death signal.
        return subprocess.Popen(
            [sys.executable, "-m", self.module, "--fd", str(fd), "--parent", str(os.getpid())],
            pass_fds=(fd,),
        )

    def start(self) -> None:
        for i in range(self.count):
            self.procs[i], self.started_at[i] = self._spawn(), time.monotonic()
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
                self.procs[i], self.started_at[i] = self._spawn(), time.monotonic()

    def stop(self) -> None:
        """SIGTERM to each, a wait for all of them together, SIGKILL to those still running; then the socket closed."""
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
