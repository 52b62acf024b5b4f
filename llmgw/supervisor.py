"""The lean parent of ``llmgw serve`` when the admin listener runs in several processes.

Once ``llmgw serve`` has checked the configuration, migrated and bound both
listening sockets, it has nothing left to do but start, watch and stop its
children; it does that in this module, into which it replaces itself
(``exec``: same pid, so the children's ``--parent`` and an operator's
``kill`` still name it). Django, DRF, Celery and the control plane's apps
are never imported here (an import contract holds it): a parent that keeps
them loaded holds about 100 MB that no request ever uses, and at 10,000
nodes the server's whole budget is 1 GB.

With one admin process the parent is that process and serves requests
itself (llmgw.serve.main); this module is not used.

Its absence (an older ``llmgw serve``) only costs that memory.
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
from pathlib import Path

from llmgw import embedded_db
from llmgw.children import die_with_parent
from llmgw.listener_processes import ListenerProcesses

log = logging.getLogger("llmgw.serve")
WORKER_STOP_TIMEOUT_S = 15
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
"""The same lines as llmgw.settings.LOGGING writes, for one log that reads alike."""


# How a worker runs its tasks: two threads of its one process, here and in deploy/systemd/llmgw-worker.service
# (tests/deploy/test_systemd.py holds the two alike). With Celery's default pool, two forked processes, each
# process that had run a reconciling pass kept its own planner and snapshot reader, with the pages around them
# (some 65 MB each at 10,000 nodes), and each held a Django of its own: llmgw serve's processes took 1,108 MB
# there, and 802 MB with threads (bench/scale.py --replicas-first). The tasks wait on the database far more
# than they compute, the reconciler's own CPU is a tenth of a second a pass, and a task that would run past
# the guard's window keeps one thread while the other takes the rest (llmgw.worker_guard).
WORKER_POOL = ("--pool=threads", "--concurrency=2")


class ProcessWorker:
    """``celery -A llmgw worker -B`` as a child process, in a process group of its own, started again if it exits.

    The group lets stop() reach the worker's pool and beat processes too: the
    worker usually takes them down itself, but one that is stuck must not
    outlive the server. A worker that exits on its own (one that found
    itself quiet, llmgw.worker_guard; one that was killed) is started again
    after RESTART_S, as systemd's ``Restart=always`` does for the separate
    unit.
    """

    RESTART_S = 2.0

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.stopping = threading.Event()
        self.watcher: threading.Thread | None = None

    def start(self) -> None:
        self._spawn()
        self.watcher = threading.Thread(target=self._keep_running, name="celery-worker-watch", daemon=True)
        self.watcher.start()

    def _spawn(self) -> None:
        cmd = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "llmgw",
            "--quiet",
            "worker",
            "-B",
            "--loglevel=WARNING",
            *WORKER_POOL,
            "--without-gossip",
            "--without-mingle",
        ]
        self.proc = subprocess.Popen(cmd, preexec_fn=die_with_parent, start_new_session=True)

    def _keep_running(self) -> None:
        while not self.stopping.is_set():
            proc = self.proc
            status = proc.wait()
            if self.stopping.wait(self.RESTART_S):
                return
            # What it left of its group (a pool process, the beat) goes first: a second beat would queue twice.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            log.warning("llmgw: the Celery worker exited (status %s); starting it again", status)
            self._spawn()

    def stop(self) -> None:
        self.stopping.set()
        if self.proc is None:
            return
        group = self.proc.pid
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGTERM)
        try:
            self.proc.wait(WORKER_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        deadline = time.monotonic() + 5
        while _group_alive(group) and time.monotonic() < deadline:
            time.sleep(0.1)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True


def stop_signals() -> threading.Event:
    """An event set by SIGTERM or SIGINT from now on."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return stop


def command(
    admin_fds: list[int],
    admin_workers: int,
    gateway_fds: list[int],
    gateway_workers: int,
    worker: bool,
    embedded_db: Path | None = None,
) -> list[str]:
    """The argv that llmgw.serve execs into; main() reads it back. ``*_fds``: llmgw.listener_processes.listen's.

    ``embedded_db``: the data dir whose embedded PostgreSQL serve started (llmgw.embedded_db); None for a server
    of the operator's own.
    """
    argv = [sys.executable, "-m", "llmgw.supervisor", "--admin-fds", _listed(admin_fds), "--admin-workers"]
    argv += [str(admin_workers), "--gateway-fds", _listed(gateway_fds), "--gateway-workers", str(gateway_workers)]
    argv += [] if embedded_db is None else ["--embedded-db", str(embedded_db)]
    return argv + ([] if worker else ["--no-worker"])


def _listed(fds: list[int]) -> str:
    return ",".join(map(str, fds))


def _sockets(listed: str) -> list[socket.socket]:
    return [socket.socket(fileno=int(fd)) for fd in listed.split(",")]


def main(argv: list[str] | None = None) -> int:
    # Before anything is started: a SIGTERM from here on stops what was started, in order.
    stop = stop_signals()
    parser = argparse.ArgumentParser(prog="python -m llmgw.supervisor", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--admin-fds", required=True, help="the admin listener's sockets, bound by llmgw serve: one, or one a process"
    )
    parser.add_argument("--admin-workers", type=int, required=True)
    parser.add_argument("--gateway-fds", required=True, help="the gateway listener's sockets, as --admin-fds")
    parser.add_argument("--gateway-workers", type=int, required=True)
    parser.add_argument("--no-worker", action="store_true", help="no Celery worker and beat")
    parser.add_argument("--embedded-db", type=Path, help="the data dir whose embedded PostgreSQL to stop last")
    args = parser.parse_args(argv)
    logging.basicConfig(format=LOG_FORMAT, level=logging.INFO)
    if args.embedded_db is not None:
        # serve registered this pid as one of the server's users before its exec, and exec skipped
        # the exit hook that would have unregistered it: this process takes the hook up again, so the
        # server stops when the supervisor, after its children, ends.
        embedded_db.url(args.embedded_db)

    worker = None if args.no_worker else ProcessWorker()
    gateway = ListenerProcesses(_sockets(args.gateway_fds), args.gateway_workers, "llmgw.gateway_server", "gateway")
    admin = ListenerProcesses(_sockets(args.admin_fds), args.admin_workers, "llmgw.admin_server", "admin")
    try:
        if worker is not None:
            worker.start()
        gateway.start()
        admin.start()
        # A timed wait, so that the main thread comes back to run the signal handler.
        while not stop.wait(1.0):
            pass
    finally:
        # SIGTERM to each admin process: it stops taking requests, writes its queued beats and ends.
        admin.stop()
        gateway.stop()
        if worker is not None:
            worker.stop()
    print("llmgw: stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
