"""``llmgw serve``: the control plane in one command.

Steps:

1. Read the configuration; a bad value stops here with one line.
2. Check the database answers, then apply migrations. Without
   LLMGW_DATABASE_URL the database is a PostgreSQL of llmgw's own in the data
   dir (llmgw.embedded_db), started as Django is set up and stopped when this
   process and its children have ended.
3. On first start, create the operator ``admin`` and write its password, an
   API token and an agent join token into the data dir (mode 0600).
4. Start the Celery worker and beat, unless ``--no-worker``: in the embedded
   configuration as threads of this process (the in-memory channel layer only
   reaches this process, and the worker publishes live updates); with Redis as
   a child process, which dies with this one.
5. Start the gateway listener's processes (LLMGW_GATEWAY_WORKERS of them,
   uvicorn; see llmgw.gateway_server for why) on a socket bound here.
6. Serve the admin listener with uvicorn (llmgw.admin_server) until
   SIGINT/SIGTERM in this process, then stop the gateway processes and the
   worker, and exit. With LLMGW_ADMIN_WORKERS above one, steps 4 and 5 and
   the admin processes are left to llmgw.supervisor instead: this process
   binds both sockets and replaces itself with it (same pid), so that the
   parent that only watches its children does not keep Django loaded. At
   SIGTERM it stops the admin processes (each writes the heartbeats it
   queued), the gateway processes and the worker.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import threading
from typing import NoReturn

from core import config, dbpool, tracing
from llmgw import embedded_db, supervisor
from llmgw.listener_processes import ListenerProcesses, listen
from llmgw.supervisor import WORKER_STOP_TIMEOUT_S, ProcessWorker


def fail(message: str) -> int:
    print(f"llmgw: {message}", file=sys.stderr)
    return 2


def database_error() -> str | None:
    """Why the database cannot be used, in one line; None when it answers."""
    from django.db import connection

    try:
        connection.ensure_connection()
    except Exception as exc:  # noqa: BLE001 - every failure stops start-up the same way
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return first
    finally:
        connection.close()
    return None


def address_error(variable: str, addr: config.Address) -> str | None:
    family = socket.AF_INET6 if ":" in addr.host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((addr.host, addr.port))
        except OSError as exc:
            return f"{variable}: cannot listen on {addr}: {exc.strerror}"
    return None


class ThreadWorker:
    """Celery worker (solo pool) and beat as threads of this process."""

    def __init__(self, app) -> None:
        from celery import beat
        from celery.worker import WorkController

        self.worker = WorkController(
            app=app,
            pool="solo",
            concurrency=1,
            hostname=f"embedded@{socket.gethostname()}",
            without_heartbeat=True,
            without_mingle=True,
            without_gossip=True,
            loglevel="WARNING",
        )
        self.beat = beat.EmbeddedService(app, thread=True, scheduler_cls=app.conf.beat_scheduler)
        self.thread = threading.Thread(target=self.worker.start, name="celery-worker", daemon=True)

    def start(self) -> None:
        self.thread.start()
        self.beat.start()

    def stop(self) -> None:
        self.beat.stop()
        self.worker.stop(in_sighandler=False)
        self.thread.join(WORKER_STOP_TIMEOUT_S)


def announce(cfg: config.Config, written: list) -> None:
    admin = "" if cfg.admin_workers == 1 else f"; {cfg.admin_workers} processes, LLMGW_ADMIN_WORKERS"
    print(f"llmgw: admin   http://{cfg.admin_addr.url_host}/admin/  (API at /api/v1/{admin})", flush=True)
    processes = "1 process" if cfg.gateway_workers == 1 else f"{cfg.gateway_workers} processes"
    print(f"llmgw: gateway http://{cfg.gateway_addr.url_host}/v1/  ({processes}, LLMGW_GATEWAY_WORKERS)", flush=True)
    database = "PostgreSQL" if cfg.database_url else f"PostgreSQL of its own in {embedded_db.folder(cfg.data_dir)}"
    if cfg.embedded:
        mode = f"{database}; no Redis: filesystem broker, in-process worker, live updates within this process"
    else:
        mode = f"{database}; Redis for the broker and live updates"

    print(f"llmgw: data dir {cfg.data_dir}; mode: {mode}", flush=True)
    if written:
        print(
            "llmgw: first start: user 'admin' created; its password, an API token and the agent join "
            f"token are in {cfg.data_dir}/admin-password, admin-token and join-token (mode 0600)",
            flush=True,
        )
    else:
        print(f"llmgw: the admin password is in {cfg.data_dir}/admin-password", flush=True)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="llmgw serve", description="Run the control plane.")
    parser.add_argument(
        "--no-worker",
        action="store_true",
        help="leave the Celery worker and beat to separate 'celery -A llmgw worker -B' processes",
    )
    args = parser.parse_args(argv)
    try:
        cfg = config.load()
    except config.ConfigError as exc:
        return fail(f"configuration error: {exc}")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmgw.settings")
    import django

    django.setup()
    # This process's own spans (the embedded Celery worker's reconciles); the gateway's processes set up theirs.
    tracing.setup("llmgw")
    problem = database_error()
    if problem:
        return fail(f"configuration error: LLMGW_DATABASE_URL: the database cannot be reached: {problem}")
    if cfg.admin_workers == 1:
        # This process serves the admin listener itself (below): its connections come from the pool
        # its requests will share, from the migration's on. Not the check's above: against a database
        # that does not answer, a pool would only have said that it timed out.
        dbpool.pool_this_process(cfg.admin_db_connections)
    for variable, addr in (("LLMGW_ADMIN_ADDR", cfg.admin_addr), ("LLMGW_GATEWAY_ADDR", cfg.gateway_addr)):
        problem = address_error(variable, addr)
        if problem:
            return fail(f"configuration error: {problem}")

    from django.core import checks
    from django.core.management import call_command

    from llmgw.bootstrap import first_start

    # Settings read by periodic work (the autoscaler's, say) are checked now, not at their first use.
    for message in checks.run_checks(tags=["llmgw-config"]):
        if message.is_serious():
            return fail(f"configuration error: {message.msg}")

    call_command("migrate", interactive=False, verbosity=0)
    boot = first_start(cfg.data_dir)
    announce(cfg, boot.written)

    if cfg.admin_workers > 1:
        become_supervisor(cfg, worker=not args.no_worker)
    worker = None
    if not args.no_worker:
        from llmgw.celery import app as celery_app

        worker = ThreadWorker(celery_app) if cfg.embedded else ProcessWorker()
        worker.start()
    gateway = ListenerProcesses(
        listen(cfg.gateway_addr.host, cfg.gateway_addr.port, cfg.gateway_workers),
        cfg.gateway_workers,
        "llmgw.gateway_server",
        "gateway",
    )
    gateway.start()
    try:
        # This process is the admin listener until SIGTERM or SIGINT; it has written the heartbeats
        # it queued when this returns.
        from llmgw import admin_server

        admin_server.serve(host=cfg.admin_addr.host, port=cfg.admin_addr.port)
    finally:
        gateway.stop()
        if worker is not None:
            worker.stop()
    print("llmgw: stopped", flush=True)
    return 0


def become_supervisor(cfg: config.Config, worker: bool) -> NoReturn:
    """Bind both listeners' sockets, then replace this process with llmgw.supervisor, which starts the children.

    Several admin processes leave the parent nothing to serve, and what it
    loaded to migrate (Django, every app) would stay resident for nothing.
    Nothing is started before the exec: no child, whose death signal would
    be tied to a thread that exec ends, and no thread, which exec would end
    mid-work. Does not return unless the exec fails.
    """
    from django.db import connections

    admin_socks = listen(cfg.admin_addr.host, cfg.admin_addr.port, cfg.admin_workers)
    gateway_socks = listen(cfg.gateway_addr.host, cfg.gateway_addr.port, cfg.gateway_workers)
    connections.close_all()
    argv = supervisor.command(
        [s.fileno() for s in admin_socks],
        cfg.admin_workers,
        [s.fileno() for s in gateway_socks],
        cfg.gateway_workers,
        worker=worker,
        embedded_db=None if cfg.database_url else cfg.data_dir,
    )
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(argv[0], argv)  # returns only by raising
