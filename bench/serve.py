"""``llmgw serve`` started by a benchmark, on its own ports, data dir and database."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_serve(
    data: Path, database_url: str, redis_url: str | None, timeout_s: float = 120, settings: dict[str, str] | None = None
) -> subprocess.Popen:
    """The server, once its admin listener answers and it has written its join token; ``.admin`` is its address.

    None of the caller's own ``LLMGW_*`` settings reach it (``settings`` are
    added, LLMGW_ADMIN_WORKERS say); it runs in a
    session of its own, so the benchmark can end it and its workers together.
    """
    admin, gateway = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMGW_")}
    env.update(LLMGW_DATA_DIR=str(data), LLMGW_DATABASE_URL=database_url, LLMGW_ADMIN_ADDR=admin)
    env.update(LLMGW_GATEWAY_ADDR=gateway, **({"LLMGW_REDIS_URL": redis_url} if redis_url else {}))
    env.update(settings or {})
    proc = subprocess.Popen(
        [sys.executable, "-m", "llmgw.cli", "serve"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=(data / "serve.log").open("w"),
        start_new_session=True,
    )
    proc.admin = admin
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://{admin}/healthz", timeout=2).status_code == 200 and (data / "join-token").exists():
                return proc
        except httpx.TransportError:
            pass
        time.sleep(0.3)
    proc.kill()
    raise SystemExit("llmgw serve did not start; see " + str(data / "serve.log"))
