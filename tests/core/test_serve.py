"""``llmgw serve`` as a user starts it: a subprocess on a fresh data dir.

The first test uses the embedded defaults (no PostgreSQL, no Redis); the
second runs with Redis, where the worker is a child process that must not
outlive the server.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from llmgw import embedded_db
from tests import embedded as embedded_rows

pytestmark = pytest.mark.slow
START_TIMEOUT_S = 60
READY_PROBES = 16


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid``, read from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


class Server:
    def __init__(self, tmp_path: Path, *args: str, **env: str) -> None:
        self.data = tmp_path / "data"
        self.admin = f"127.0.0.1:{free_port()}"
        self.gateway = f"127.0.0.1:{free_port()}"
        clean = {k: v for k, v in os.environ.items() if not k.startswith("LLMGW_")}
        clean.update(
            LLMGW_DATA_DIR=str(self.data),
            LLMGW_ADMIN_ADDR=self.admin,
            LLMGW_GATEWAY_ADDR=self.gateway,
            LLMGW_EVERY_TICK="1",
            PYTHONUNBUFFERED="1",
            **env,
        )
        self.log = tmp_path / "serve.log"
        # Started in an empty folder of its own, so a test can see what it writes outside its data dir.
        self.cwd = tmp_path / "cwd"
        self.cwd.mkdir(exist_ok=True)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "llmgw.cli", "serve", *args],
            env=clean,
            cwd=self.cwd,
            stdout=self.log.open("w"),
            stderr=subprocess.STDOUT,
        )

    def wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log.read_text()
            # Both listeners: the gateway's workers start after the admin listener answers,
            # and a request sent before one accepts waits in the socket's queue (seconds,
            # on a loaded host) — longer than a client's default timeout. Each process of a
            # listener has a socket of its own, and the kernel picks one by the connection's
            # ports: READY_PROBES fresh connections each reach every one of two processes
            # but for a chance of 2 in 2^READY_PROBES.
            try:
                if all(
                    httpx.get(f"http://{addr}/healthz", timeout=2).status_code == 200
                    for addr in (self.admin, self.gateway)
                    for _ in range(READY_PROBES)
                ):
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.3)
        raise AssertionError("llmgw serve did not answer /healthz:\n" + self.log.read_text())

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=30)


@pytest.fixture
def embedded(tmp_path):
    server = Server(tmp_path)
    yield server
    if server.proc.poll() is None:
        server.proc.kill()


def test_embedded_serve_answers_on_both_listeners_and_stops_cleanly(embedded):
    server = embedded
    server.wait_ready()

    health = httpx.get(f"http://{server.admin}/healthz").json()
    assert health["listener"] == "admin"
    assert health["database"] == {"ok": True, "engine": "postgresql"}
    # Its own PostgreSQL, in the data dir, on a socket there; the data dir's listing still private.
    assert embedded_db.running_url(server.data) and (server.data / "postgres" / "PG_VERSION").exists()
    assert stat.S_IMODE(server.data.stat().st_mode) & 0o066 == 0
    assert health["channel_layer"]["ok"] and health["channel_layer"]["kind"] == "in-memory"
    assert health["broker"]["ok"] and health["broker"]["kind"] == "filesystem"
    assert health["version"] and health["django"].startswith("5.2")

    gateway_health = httpx.get(f"http://{server.gateway}/healthz")
    assert gateway_health.status_code == 200 and gateway_health.json()["listener"] == "gateway"

    login = httpx.get(f"http://{server.admin}/admin/login/")
    assert login.status_code == 200 and "csrfmiddlewaretoken" in login.text
    for path in ("/admin/login/", "/admin/", "/api/v1/schema", "/", "/metrics"):
        assert httpx.get(f"http://{server.gateway}{path}").status_code == 404, path

    # The first start wrote the operator's secrets, readable by this user alone.
    for name in ("admin-password", "admin-token", "join-token"):
        path = server.data / name
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, name
        assert len(path.read_text().strip()) >= 20
    assert "admin-password" in server.log.read_text()

    token = (server.data / "admin-token").read_text().strip()
    assert httpx.get(f"http://{server.admin}/api/v1/schema").status_code == 401
    schema = httpx.get(f"http://{server.admin}/api/v1/schema", headers={"Authorization": f"Bearer {token}"})
    assert schema.status_code == 200
    bad = httpx.get(f"http://{server.admin}/api/v1/schema", headers={"Authorization": "Bearer nope"})
    assert bad.status_code == 401 and "unknown or has been revoked" in bad.json()["error"]

    # The operator can log in with the password that was written down.
    with httpx.Client(base_url=f"http://{server.admin}") as browser:
        page = browser.get("/admin/login/")
        csrf = browser.cookies["csrftoken"]
        password = (server.data / "admin-password").read_text().strip()
        answer = browser.post(
            "/admin/login/?next=/admin/",
            data={"username": "admin", "password": password, "csrfmiddlewaretoken": csrf, "next": "/admin/"},
        )
        assert answer.status_code == 302 and page.status_code == 200
        assert browser.get("/admin/").status_code == 200

    # The embedded worker and beat run the periodic tasks without Redis.
    deadline = time.monotonic() + 30
    while httpx.get(f"http://{server.admin}/healthz").json()["worker"].get("last_tick") is None:
        assert time.monotonic() < deadline, "the periodic tick never ran:\n" + server.log.read_text()
        time.sleep(0.5)

    pid = server.proc.pid
    assert server.stop() == 0, server.log.read_text()
    assert not descendants(pid)
    assert embedded_db.running_url(server.data) is None, "its PostgreSQL stops with it"
    assert "Traceback" not in server.log.read_text(), server.log.read_text()
    # Nothing outside the data dir: kombu's filesystem broker wrote a relative control/ folder
    # into whatever folder serve was started in (issue #19).
    assert sorted(p.name for p in server.cwd.iterdir()) == []


def test_restart_keeps_the_secrets(tmp_path):
    first = Server(tmp_path)
    first.wait_ready()
    password = (first.data / "admin-password").read_text()
    assert first.stop() == 0
    second = Server(tmp_path)
    try:
        second.wait_ready()
        assert (second.data / "admin-password").read_text() == password
        assert "first start" not in second.log.read_text()
    finally:
        second.stop()


def test_with_redis_the_worker_is_a_child_that_dies_with_the_server(tmp_path):
    redis_url = os.environ.get("LLMGW_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
    server = Server(tmp_path, LLMGW_REDIS_URL=redis_url)
    try:
        server.wait_ready()
        health = httpx.get(f"http://{server.admin}/healthz").json()
        assert health["channel_layer"] == {"ok": True, "kind": "redis"}
        assert health["broker"] == {"ok": True, "kind": "redis"}
        deadline = time.monotonic() + 60
        while httpx.get(f"http://{server.admin}/healthz").json()["worker"].get("last_tick") is None:
            assert time.monotonic() < deadline, "the worker never ran the tick:\n" + server.log.read_text()
            time.sleep(0.5)
        children = descendants(server.proc.pid)
        assert children, "the Celery worker runs as a child process"
        assert server.stop() == 0, server.log.read_text()
        time.sleep(0.5)
        assert not [pid for pid in children if alive(pid)], "no process outlives llmgw serve"
    finally:
        if server.proc.poll() is None:
            server.proc.kill()


def celery_children(pid: int) -> list[int]:
    """The Celery worker processes started directly by ``pid``."""
    found = []
    for child in descendants(pid):
        try:
            args = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
            parent = int(Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError):
            continue
        if parent == pid and b"celery" in args:
            found.append(child)
    return found


def test_with_redis_a_worker_that_exits_is_started_again(tmp_path):
    """As systemd's Restart=always for the unit: a worker that exits (killed here; one that found itself quiet
    exits too, llmgw.worker_guard) is replaced, and the periodic tasks run again."""
    redis_url = os.environ.get("LLMGW_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
    server = Server(tmp_path, LLMGW_REDIS_URL=redis_url)
    try:
        server.wait_ready()
        deadline = time.monotonic() + 60
        while not celery_children(server.proc.pid):
            assert time.monotonic() < deadline, "no worker:\n" + server.log.read_text()
            time.sleep(0.2)
        (first,) = celery_children(server.proc.pid)
        os.killpg(first, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while celery_children(server.proc.pid) in ([], [first]):
            assert time.monotonic() < deadline, "the worker was not started again:\n" + server.log.read_text()
            time.sleep(0.2)
        (second,) = celery_children(server.proc.pid)
        assert second != first and not alive(first)
        assert "the Celery worker exited (status -9); starting it again" in server.log.read_text()
        # The new one runs the tick (the beat came back with it).
        before = httpx.get(f"http://{server.admin}/healthz").json()["worker"].get("last_tick")
        deadline = time.monotonic() + 60
        while httpx.get(f"http://{server.admin}/healthz").json()["worker"].get("last_tick") == before:
            assert time.monotonic() < deadline, "no tick after the restart:\n" + server.log.read_text()
            time.sleep(0.5)
        children = descendants(server.proc.pid)
        assert server.stop() == 0, server.log.read_text()
        time.sleep(0.5)
        assert not [pid for pid in children if alive(pid)], "no process outlives llmgw serve"
    finally:
        if server.proc.poll() is None:
            server.proc.kill()


def test_gateway_refuses_everything_but_v1_and_healthz():
    from llmgw.listeners import gateway_path_allowed

    assert gateway_path_allowed("/v1/chat/completions") and gateway_path_allowed("/healthz")
    assert not gateway_path_allowed("/v1admin") and not gateway_path_allowed("/admin/")
    assert not gateway_path_allowed("/healthz/extra")


def test_no_worker_flag_leaves_the_worker_out(tmp_path):
    server = Server(tmp_path)
    server.proc.kill()
    server.proc.wait()
    clean = {k: v for k, v in os.environ.items() if not k.startswith("LLMGW_")}
    clean.update(
        LLMGW_DATA_DIR=str(server.data),
        LLMGW_ADMIN_ADDR=server.admin,
        LLMGW_GATEWAY_ADDR=server.gateway,
        LLMGW_EVERY_TICK="1",
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "llmgw.cli", "serve", "--no-worker"],
        env=clean,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    server.proc = proc
    try:
        server.wait_ready()
        time.sleep(3)
        assert httpx.get(f"http://{server.admin}/healthz").json()["worker"] == {"last_tick": None}
        assert json.loads(httpx.get(f"http://{server.gateway}/healthz").text)["status"] == "ok"
    finally:
        assert server.stop() == 0


def test_the_gateway_processes_end_when_llmgw_serve_is_killed(tmp_path):
    server = Server(tmp_path)
    try:
        server.wait_ready()
        deadline = time.monotonic() + 20
        while not (children := descendants(server.proc.pid)) and time.monotonic() < deadline:
            time.sleep(0.2)
        gateways = [p for p in children if b"llmgw.gateway_server" in Path(f"/proc/{p}/cmdline").read_bytes()]
        assert gateways, "the gateway listener runs in a child process"
        assert httpx.get(f"http://{server.gateway}/healthz").status_code == 200
        server.proc.kill()  # no chance to stop them: the death signal has to
        server.proc.wait()
        deadline = time.monotonic() + 15
        while [p for p in gateways if alive(p)] and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [p for p in gateways if alive(p)], "a gateway process outlived llmgw serve"
    finally:
        if server.proc.poll() is None:
            server.proc.kill()


def test_a_heartbeat_queued_when_sigterm_comes_is_written_before_serve_ends(tmp_path):
    """The flusher writes once an interval; a stop between two writes still writes what was queued."""
    server = Server(tmp_path, LLMGW_HEARTBEAT_FLUSH_S="3600")
    try:
        server.wait_ready()
        join = (server.data / "join-token").read_text().strip()
        registered = httpx.post(
            f"http://{server.admin}/api/v1/agent/register",
            json={"name": "tray-01", "machine_id": "m-1"},
            headers={"Authorization": f"Bearer {join}"},
        )
        assert registered.status_code in (200, 201), registered.text
        credential = registered.json()["credential"]
        beat = httpx.post(
            f"http://{server.admin}/api/v1/agent/heartbeat",
            json={"load": {"cpu_percent": 42.0}},
            headers={"Authorization": f"Bearer {credential}"},
        )
        assert beat.status_code == 200, beat.text

        def load() -> dict | None:
            return embedded_rows.rows(server.data, "SELECT load FROM inventory_node WHERE name = 'tray-01'")[0][0]

        assert "42.0" not in str(load()), "queued, not yet written: the interval is an hour"
        assert server.stop() == 0
        assert load() == {"cpu_percent": 42.0}
    finally:
        if server.proc.poll() is None:
            server.proc.kill()


def admin_processes(server: Server, count: int) -> list[int]:
    """The admin listener's child processes, once ``count`` of them run."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        found = [
            p for p in descendants(server.proc.pid) if b"llmgw.admin_server" in Path(f"/proc/{p}/cmdline").read_bytes()
        ]
        if len(found) == count:
            return sorted(found)
        time.sleep(0.2)
    raise AssertionError(f"not {count} admin processes: {found}\n" + server.log.read_text())


def holders(pids: list[int], server_port: int, client_ports: list[int]) -> dict[int, int]:
    """Client port → which of ``pids`` holds the server's end of that open TCP connection to ``server_port``."""
    inodes: dict[str, int] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, remote, inode = int(fields[1].rsplit(":", 1)[1], 16), int(fields[2].rsplit(":", 1)[1], 16), fields[9]
            if local == server_port and remote in client_ports:
                inodes[f"socket:[{inode}]"] = remote
    found = {}
    for pid in pids:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                if (link := os.readlink(fd)) in inodes:
                    found[inodes[link]] = pid
    return found


def test_connections_opened_at_once_and_kept_are_shared_by_the_admin_processes(two_admin_processes):
    """32 kept connections opened in a burst (a load generator's, a pooling proxy's, agents reconnecting) land on
    both processes: on one shared socket the first process awake took them all (llmgw.listener_processes.listen)."""
    server, _ = two_admin_processes
    pids = admin_processes(server, 2)
    host, port = server.admin.rsplit(":", 1)
    connections = [http.client.HTTPConnection(host, int(port), timeout=30) for _ in range(32)]
    try:
        for conn in connections:
            conn.connect()
        for conn in connections:
            conn.request("GET", "/healthz")
        for conn in connections:
            assert conn.getresponse().read() and conn.sock is not None
        held = holders(pids, int(port), [c.sock.getsockname()[1] for c in connections])
    finally:
        for conn in connections:
            conn.close()
    by_process = [list(held.values()).count(p) for p in pids]
    # An even share by the kernel's hash: fewer than 4 of 32 on one process is a chance of about 1 in 400,000.
    assert sum(by_process) == 32 and min(by_process) >= 4, by_process


@pytest.fixture
def two_admin_processes(tmp_path):
    """llmgw serve with LLMGW_ADMIN_WORKERS=2, on Redis and a PostgreSQL database of its own; beats flushed hourly."""
    yield from serve_two_admin_processes(tmp_path)


def serve_two_admin_processes(tmp_path: Path, *args: str):
    from tests.hostile.live import Database

    database = Database()
    server = Server(
        tmp_path,
        *args,
        LLMGW_ADMIN_WORKERS="2",
        LLMGW_REDIS_URL=os.environ.get("LLMGW_TEST_REDIS_URL", "redis://127.0.0.1:6379/15"),
        LLMGW_DATABASE_URL=database.url,
        LLMGW_HEARTBEAT_FLUSH_S="3600",
    )
    try:
        server.wait_ready()
        yield server, database
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
            server.proc.wait()
        database.drop()


def test_several_admin_processes_on_the_embedded_database_share_it_and_it_stops_with_the_supervisor(tmp_path):
    """serve execs into llmgw.supervisor: the exit hook that would stop the embedded PostgreSQL is taken up there,
    so the server outlives neither the supervisor nor its children, and the children never start one of their own."""
    server = Server(
        tmp_path,
        LLMGW_ADMIN_WORKERS="2",
        LLMGW_REDIS_URL=os.environ.get("LLMGW_TEST_REDIS_URL", "redis://127.0.0.1:6379/15"),
    )
    try:
        server.wait_ready()
        assert len(admin_processes(server, 2)) == 2
        users = json.loads((server.data / "postgres" / ".handle_pids.json").read_text())
        assert users == [server.proc.pid], "the supervisor alone: its children inherit the URL"
        assert embedded_rows.rows(server.data, "SELECT count(*) FROM auth_user WHERE username = 'admin'") == [(1,)]
        assert server.stop() == 0, server.log.read_text()
        assert embedded_db.running_url(server.data) is None, "stopped with the supervisor"
    finally:
        if server.proc.poll() is None:
            server.proc.kill()


def test_several_admin_processes_each_write_the_beats_they_queued_when_serve_is_stopped(two_admin_processes):
    """Both processes take beats (each beat on a connection of its own, which the kernel hands to one of them by
    its ports; the test sees which) and write them when llmgw serve is stopped: none is lost with the process
    that queued it."""
    import psycopg

    server, database = two_admin_processes
    pids = admin_processes(server, 2)
    join = (server.data / "join-token").read_text().strip()
    host, port = server.admin.rsplit(":", 1)
    names, took = [], {p: [] for p in pids}
    # Until each process has taken two beats: 16 nodes are enough but for a chance of 1 in 2,000.
    while min(map(len, took.values())) < 2:
        assert len(names) < 64, took
        name = f"tray-{len(names):02}"
        registered = httpx.post(
            f"http://{server.admin}/api/v1/agent/register",
            json={"name": name, "machine_id": f"m-{name}"},
            headers={"Authorization": f"Bearer {join}"},
            timeout=30,
        )
        assert registered.status_code == 201, registered.text
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        try:
            conn.request(
                "POST",
                "/api/v1/agent/heartbeat",
                json.dumps({"load": {"cpu_percent": float(len(names))}}),
                {"Authorization": f"Bearer {registered.json()['credential']}", "Content-Type": "application/json"},
            )
            beat = conn.getresponse()
            assert beat.status == 200, beat.read()
            beat.read()
            (holder,) = holders(pids, int(port), [conn.sock.getsockname()[1]]).values()
        finally:
            conn.close()
        took[holder].append(name)
        names.append(name)

    def loads() -> dict[str, object]:
        with psycopg.connect(database.url) as conn:
            return dict(conn.execute("SELECT name, load FROM inventory_node").fetchall())

    assert not any(loads().values()), "queued, not yet written: the interval is an hour"
    assert server.stop() == 0, server.log.read_text()
    assert loads() == {name: {"cpu_percent": float(i)} for i, name in enumerate(names)}
    assert not [p for p in pids if alive(p)], "no admin process outlives llmgw serve"


def test_an_admin_process_that_dies_is_started_again_and_the_listener_keeps_answering(two_admin_processes):
    """A connection the kernel hands to the dead process's socket waits there for its replacement (the supervisor
    holds the socket open), so none of the five is refused; some answer only once the new process is up."""
    server, _ = two_admin_processes
    first, second = admin_processes(server, 2)
    os.kill(first, signal.SIGKILL)
    for _ in range(5):
        assert httpx.get(f"http://{server.admin}/healthz", timeout=30).status_code == 200
    again = admin_processes(server, 2)
    assert second in again and first not in again, (first, second, again)
    assert "admin process" in server.log.read_text() and server.stop() == 0


def rss_kb(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmRSS:")).split()[1])


def test_the_parent_of_several_admin_processes_is_the_lean_supervisor_not_a_django_process(two_admin_processes):
    """With several admin processes llmgw serve migrates, then replaces itself (same pid) with llmgw.supervisor.

    A parent that kept Django and every app loaded held ~120 MB of the 1 GB
    that a 10,000-node control host is allowed, for no request. The pid the
    operator started still owns every child: admin, gateway and the Celery
    worker; and the supervisor loaded no Django (at most a small interpreter).
    """
    server, _ = two_admin_processes
    admin_processes(server, 2)
    parent = server.proc.pid
    assert b"llmgw.supervisor" in Path(f"/proc/{parent}/cmdline").read_bytes()
    below = b"\n".join(Path(f"/proc/{p}/cmdline").read_bytes() for p in descendants(parent) if alive(p))
    assert b"llmgw.gateway_server" in below and b"celery" in below, below
    assert rss_kb(parent) < 60_000, f"{rss_kb(parent)} kB: the supervisor holds more than an interpreter"
    # The admin processes' memory, for scale: each holds Django and the apps.
    assert all(rss_kb(p) > 2 * rss_kb(parent) for p in admin_processes(server, 2))
    assert server.stop() == 0, server.log.read_text()


def test_every_child_of_the_supervisor_ends_when_it_is_killed_outright(two_admin_processes):
    """The exec keeps the promise that nothing outlives llmgw serve: each child's death signal is tied to
    the supervisor (started from its main thread, after the exec), not to the Django process it replaced."""
    server, _ = two_admin_processes
    admin_processes(server, 2)
    deadline = time.monotonic() + 30
    while not celery_children(server.proc.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    children = descendants(server.proc.pid)
    assert celery_children(server.proc.pid) and len(children) >= 4, children
    server.proc.kill()
    server.proc.wait()
    deadline = time.monotonic() + 30
    while [p for p in children if alive(p)] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [p for p in children if alive(p)], "a child outlived the supervisor"


def test_the_supervisor_without_a_worker_starts_none_and_stops_cleanly(tmp_path):
    """``--no-worker`` reaches the supervisor through the exec: the listeners, and no Celery process."""
    served = serve_two_admin_processes(tmp_path, "--no-worker")
    server, _ = next(served)
    try:
        admin_processes(server, 2)
        time.sleep(2)  # the worker, had it been asked for, is started before the listeners
        assert not celery_children(server.proc.pid)
        assert httpx.get(f"http://{server.gateway}/healthz").status_code == 200
        assert server.stop() == 0, server.log.read_text()
        assert "llmgw: stopped" in server.log.read_text()
    finally:
        served.close()


def test_the_supervisor_module_loads_no_django():
    """The import contract in pyproject.toml holds it statically; this, what an import really pulls in."""
    probe = "import sys, llmgw.supervisor; print(sorted({m.split('.')[0] for m in sys.modules}))"
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    for framework in ("django", "rest_framework", "celery", "channels", "core", "inventory"):
        assert f"'{framework}'" not in loaded, loaded


def test_a_registration_storm_borrows_from_the_admin_pool_and_survives_its_connections_dying(tmp_path):
    """The admin process lends its requests connections from a pool (core.dbpool), not one opened per request.

    Under ASGI no request reuses another's connection, and before the pool each
    registration opened one of its own: PostgreSQL forked a process for it
    (most of a registration's cost), and left to the garbage collector they
    piled up to max_connections at 10,000 registrations. Six clients against a
    pool of two: they wait their turn rather than fail; PostgreSQL sees a
    handful of sessions for 240 registrations, not 240; and when every
    connection it holds is killed (a failover, a restarted server), the next
    registrations get fresh ones, not the dead.
    """
    from concurrent.futures import ThreadPoolExecutor

    import psycopg

    from tests.hostile.live import Database

    database = Database()
    # Without the worker: Celery opens a connection for each task (its Django fixup closes them around
    # every task), and the beat ticks every second here; the sessions counted are then the listeners'.
    server = Server(
        tmp_path,
        "--no-worker",
        LLMGW_REDIS_URL=os.environ.get("LLMGW_TEST_REDIS_URL", "redis://127.0.0.1:6379/15"),
        LLMGW_DATABASE_URL=database.url,
        LLMGW_ADMIN_DB_CONNECTIONS="2",
    )
    try:
        server.wait_ready()
        join = (server.data / "join-token").read_text().strip()

        def admin(query: str):
            with psycopg.connect(database.admin_url, autocommit=True) as conn:
                return conn.execute(query, (database.name,)).fetchall()

        def opened() -> int:
            return admin("SELECT count(*) FROM pg_stat_activity WHERE datname = %s")[0][0]

        def sessions() -> int:
            # Counted as a session ends or its backend reports; a short wait lets the last ones report.
            time.sleep(1.5)
            return admin("SELECT sessions FROM pg_stat_database WHERE datname = %s")[0][0]

        def register(n: int) -> int:
            return httpx.post(
                f"http://{server.admin}/api/v1/agent/register",
                json={"name": f"tray-{n:03}", "machine_id": f"m-{n}"},
                headers={"Authorization": f"Bearer {join}"},
                timeout=30,
            ).status_code

        assert register(999) == 201, server.log.read_text()[-5000:]  # the pool's first connection is open
        before, began, seen = opened(), sessions(), []
        with ThreadPoolExecutor(6) as pool:
            for start in range(0, 240, 40):
                assert set(pool.map(register, range(start, start + 40))) == {201}
                seen.append(opened())
        # The pool's second connection.
        assert max(seen) <= before + 1, (before, seen)
        held = admin("SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND application_name = 'llmgw-admin'")
        assert held[0][0] <= 2, held
        assert sessions() - began <= 4, "a session per registration: the pool is not used"

        admin("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()")
        with ThreadPoolExecutor(6) as pool:
            assert set(pool.map(register, range(240, 260))) == {201}, server.log.read_text()[-3000:]
        assert server.stop() == 0, server.log.read_text()
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
            server.proc.wait()
        database.drop()
