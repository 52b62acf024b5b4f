"""Two control hosts on one machine, from the files in deploy/: etcd, Patroni with two PostgreSQL, HAProxy, llmgw.

Everything runs under one temporary folder on loopback ports of its own,
from the shipped deploy/ files with only each host's addresses, ports and
folders changed: one etcd member, two Patroni-managed PostgreSQL instances
(a leader and a synchronous standby), one HAProxy in front of the leader and
of both control hosts' admin and gateway listeners, two ``llmgw serve
--no-worker`` with a Celery worker each, and one beat. Every process is in a
process group of its own and is ended by :meth:`Cluster.close`.

The llmgw units are kept running as systemd keeps them (``Restart=always``,
after the unit's ``RestartSec``): one that exits without the harness having
stopped or killed it is started again on the same command, its output
appended to the same log, and the restart recorded (:attr:`Proc.restarts`),
so that a failure can say what died and when.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import yaml

from tests.deploy.tools import DEPLOY, env_file

PG_USER = "postgres"
"""PostgreSQL refuses to run as root; Patroni and its servers run as this account."""
SUPERUSER_PASSWORD = "CHANGE-ME-superuser-password"
"""The shipped example's password, as deploy/patroni/patroni.yml has it."""
REAP_EVERY_S = 2.0
"""The beat's period for gateway.tasks.reap_leases here (LLMGW_EVERY_REAP_LEASES; a minute as shipped)."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until(condition, timeout: float, what: str, interval: float = 0.2):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            value = condition()
        except Exception as exc:  # noqa: BLE001 - kept to say why it never held
            last, value = exc, None
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"{what} did not happen within {timeout} s (last error: {last})")


@dataclass
class Proc:
    """One started process, in its own process group, with its output in a log file."""

    name: str
    popen: subprocess.Popen
    log: Path
    restart: Callable[[], subprocess.Popen] | None = None
    """How to start it again when it exits on its own (the llmgw units); None: left down."""
    restart_s: float = 2.0
    down: bool = False
    """Stopped or killed by the harness: not started again."""
    restarts: list[tuple[float, int]] = field(default_factory=list)
    """(wall time, the status it had exited with) of each restart."""
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def alive(self) -> bool:
        return self.popen.poll() is None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        with self.lock:
            self.down = True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, sig)

    def stop(self, timeout: float = 20) -> None:
        if self.alive():
            self.kill(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout)
        # Whatever the leader left behind in its group (pool processes, postgres children) goes too.
        self.kill(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(5)

    def state(self) -> str:
        """Alive or how it ended, and its restarts: what a failure message says of it."""
        now = "alive" if self.alive() else f"exited {self.popen.returncode}"
        restarts = ", ".join(f"{time.strftime('%H:%M:%S', time.localtime(t))} after {rc}" for t, rc in self.restarts)
        return f"pid {self.popen.pid} {now}" + (f"; restarted {restarts}" if restarts else "")


@dataclass
class Cluster:
    root: Path
    procs: list[Proc] = field(default_factory=list)
    ports: dict[str, int] = field(default_factory=dict)
    supervisor: threading.Thread | None = None
    closing: threading.Event = field(default_factory=threading.Event)

    def start(
        self,
        name: str,
        cmd: list[str],
        env: dict[str, str] | None = None,
        user: str | None = None,
        restart_s: float | None = None,
    ) -> Proc:
        """``cmd`` started; with ``restart_s``, started again that long after it exits on its own (Restart=always)."""
        log = self.root / f"{name}.log"
        preexec = None
        if user is not None:
            account = pwd.getpwnam(user)

            def preexec() -> None:
                os.setgid(account.pw_gid)
                os.setuid(account.pw_uid)

        def popen(mode: str = "w") -> subprocess.Popen:
            return subprocess.Popen(
                cmd,
                env=env or dict(os.environ),
                stdout=log.open(mode),
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=preexec,
                cwd=self.root,
            )

        proc = Proc(name, popen(), log)
        if restart_s is not None:
            proc.restart, proc.restart_s = (lambda: popen("a")), restart_s
            self.supervise()
        self.procs.append(proc)
        return proc

    def supervise(self) -> None:
        """The thread that starts an exited unit again, as systemd would; one per cluster."""
        if self.supervisor is not None:
            return
        self.supervisor = threading.Thread(target=self._keep_units_running, name="units", daemon=True)
        self.supervisor.start()

    def _keep_units_running(self) -> None:
        exited: dict[int, float] = {}
        while not self.closing.wait(0.2):
            for proc in list(self.procs):
                if proc.restart is None or proc.down or proc.alive():
                    continue
                first = exited.setdefault(id(proc), time.monotonic())
                if time.monotonic() - first < proc.restart_s:
                    continue
                with proc.lock:
                    if proc.down:
                        continue
                    status = proc.popen.returncode
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.popen.pid, signal.SIGKILL)  # what it left in its group, as systemd does
                    with proc.log.open("a") as out:
                        out.write(f"\n[harness] exited with status {status}; started again (Restart=always)\n")
                    proc.restarts.append((time.time(), status))
                    proc.popen = proc.restart()
                exited.pop(id(proc), None)

    def states(self) -> dict[str, str]:
        """Every llmgw unit's state (Proc.state), for failure messages."""
        return {p.name: p.state() for p in self.procs if p.restart is not None}

    def close(self) -> None:
        if self.supervisor is not None:
            self.closing.set()
            self.supervisor.join(5)
        for proc in reversed(self.procs):
            proc.stop()

    # --- Redis ---------------------------------------------------------------------------------------

    def start_redis(self) -> str:
        """A redis-server of the cluster's own (the machine's may be shared, and scenario 4 stops this one)."""
        if "redis" not in self.ports:
            self.ports["redis"] = free_port()
        port = self.ports["redis"]
        # No snapshots and no append-only file: a restart comes back empty, as a Redis whose disk was lost would.
        cmd = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        self.redis = self.start("redis", cmd)
        wait_until(lambda: redis_answers(port), 30, "redis")
        return f"redis://127.0.0.1:{port}/0"

    def stop_redis(self) -> None:
        self.redis.stop()
        self.procs.remove(self.redis)

    # --- etcd and Patroni -------------------------------------------------------------------------

    def start_etcd(self) -> None:
        client, peer = free_port(), free_port()
        self.ports["etcd"] = client
        data = self.root / "etcd"
        self.start(
            "etcd",
            [
                "etcd",
                "--name",
                "etcd1",
                "--data-dir",
                str(data),
                "--listen-client-urls",
                f"http://127.0.0.1:{client}",
                "--advertise-client-urls",
                f"http://127.0.0.1:{client}",
                "--listen-peer-urls",
                f"http://127.0.0.1:{peer}",
                "--initial-advertise-peer-urls",
                f"http://127.0.0.1:{peer}",
                "--initial-cluster",
                f"etcd1=http://127.0.0.1:{peer}",
            ],
        )
        wait_until(lambda: httpx.get(f"http://127.0.0.1:{client}/health", timeout=1).status_code == 200, 30, "etcd")

    def patroni_config(self, name: str) -> Path:
        """deploy/patroni/patroni.yml with this member's name, addresses and folders."""
        config = yaml.safe_load((DEPLOY / "patroni" / "patroni.yml").read_text())
        rest, pg = free_port(), free_port()
        self.ports[f"{name}-rest"], self.ports[f"{name}-pg"] = rest, pg
        folder = self.root / name
        folder.mkdir(mode=0o700)
        config["name"] = name
        config["restapi"].update(listen=f"127.0.0.1:{rest}", connect_address=f"127.0.0.1:{rest}")
        config["etcd3"]["hosts"] = f"127.0.0.1:{self.ports['etcd']}"
        # The example's network is 10.0.0.0/24; here every member is on loopback.
        hba = [line.replace("10.0.0.0/24", "127.0.0.1/32") for line in config["bootstrap"]["pg_hba"]]
        config["bootstrap"]["pg_hba"] = list(dict.fromkeys(hba))
        pgsql = config["postgresql"]
        pgsql.update(
            listen=f"127.0.0.1:{pg}",
            connect_address=f"127.0.0.1:{pg}",
            data_dir=str(folder / "data"),
            pgpass=str(folder / "pgpass"),
            bin_dir=pg_bin_dir(),
        )
        pgsql["parameters"]["unix_socket_directories"] = str(folder)
        path = folder / "patroni.yml"
        path.write_text(yaml.safe_dump(config))
        shutil.chown(folder, PG_USER, PG_USER)
        shutil.chown(path, PG_USER, PG_USER)
        return path

    def start_patroni(self, name: str) -> None:
        path = self.patroni_config(name)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PG", "LLMGW_"))}
        env["HOME"] = str(self.root / name)
        self.start(f"patroni-{name}", ["patroni", str(path)], env=env, user=PG_USER)

    def restart_patroni(self, name: str) -> None:
        """A member's Patroni started again on its own configuration and data (after a kill)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PG", "LLMGW_"))}
        env["HOME"] = str(self.root / name)
        self.start(f"patroni-{name}-again", ["patroni", str(self.root / name / "patroni.yml")], env=env, user=PG_USER)

    def members(self) -> list[dict]:
        """The cluster's members as the first Patroni that answers says (a killed one does not)."""
        last: Exception | None = None
        for name in ("pg1", "pg2"):
            try:
                return httpx.get(f"http://127.0.0.1:{self.ports[f'{name}-rest']}/cluster", timeout=2).json()["members"]
            except httpx.HTTPError as exc:
                last = exc
        raise AssertionError(f"no Patroni answered: {last}")

    def wait_replicated(self, timeout: float = 120) -> list[dict]:
        def ready():
            members = self.members()
            roles = sorted(m["role"] for m in members if m["state"] in ("running", "streaming"))
            return members if roles == ["leader", "sync_standby"] else None

        return wait_until(ready, timeout, "a leader and a synchronous standby")

    # --- HAProxy ----------------------------------------------------------------------------------

    def haproxy_config(self, hosts: list[Host]) -> Path:
        """deploy/haproxy/haproxy.cfg for two database members and two control hosts on loopback ports."""
        for name in ("haproxy-pg", "haproxy-admin", "haproxy-gateway"):
            self.ports[name] = free_port()
        binds = {
            "*:5000": self.ports["haproxy-pg"],
            "*:8000": self.ports["haproxy-admin"],
            "*:8080": self.ports["haproxy-gateway"],
        }
        servers = {"pg1": f"127.0.0.1:{self.ports['pg1-pg']}", "pg2": f"127.0.0.1:{self.ports['pg2-pg']}"}
        checks = {"pg1": self.ports["pg1-rest"], "pg2": self.ports["pg2-rest"]}
        lines, section = [], ""
        for line in (DEPLOY / "haproxy" / "haproxy.cfg").read_text().splitlines():
            words = line.split()
            if line and not line[0].isspace():
                section = line.strip()
            if words[:1] == ["bind"]:
                line = line.replace(words[1], f"127.0.0.1:{binds[words[1]]}")
            elif words[:1] == ["server"]:
                name = words[1]
                if name in ("pg3", "ctl3"):
                    continue
                if name in servers:
                    address = servers[name]
                    line = line.replace(f"check port {words[-1]}", f"check port {checks[name]}")
                else:
                    host = hosts[int(name[-1]) - 1]
                    address = host.gateway if "gateway" in section else host.admin
                line = line.replace(words[2], address)
            lines.append(line)
        path = self.root / "haproxy.cfg"
        path.write_text("\n".join(lines) + "\n")
        return path

    def start_haproxy(self, hosts: list[Host]) -> None:
        path = self.haproxy_config(hosts)
        check = subprocess.run(["haproxy", "-c", "-f", str(path)], capture_output=True, text=True)
        assert check.returncode == 0, check.stdout + check.stderr
        self.start("haproxy", ["haproxy", "-db", "-f", str(path)])
        # HAProxy counts a server up until its checks say otherwise, so at first a connection may still
        # reach the standby: wait until several in a row reach the leader.
        wait_until(
            lambda: all(leader_through(self.ports["haproxy-pg"]) for _ in range(5)), 60, "the leader via HAProxy"
        )

    # --- llmgw -------------------------------------------------------------------------------------

    def create_database(self) -> str:
        """The role and database of deploy/llmgw.env's LLMGW_DATABASE_URL, on the leader through HAProxy."""
        url = urlsplit(env_file(DEPLOY / "llmgw.env")["LLMGW_DATABASE_URL"])
        env = {**os.environ, "PGPASSWORD": SUPERUSER_PASSWORD}
        psql = ["psql", "-h", "127.0.0.1", "-p", str(self.ports["haproxy-pg"]), "-U", "postgres", "-d", "postgres"]
        for sql in (
            f"create role {url.username} login password '{url.password}'",
            f"create database {url.path.strip('/')} owner {url.username}",
        ):
            done = subprocess.run([*psql, "-qc", sql], env=env, capture_output=True, text=True)
            assert done.returncode == 0, f"{sql}: {done.stderr}"
        return url._replace(netloc=f"{url.username}:{url.password}@127.0.0.1:{self.ports['haproxy-pg']}").geturl()

    def host_env(self, host: Host, database_url: str, redis_url: str) -> dict[str, str]:
        """deploy/llmgw.env for this host: its addresses and data dir; the rest as shipped, shared by both."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("LLMGW_")}
        env.update(env_file(DEPLOY / "llmgw.env"))
        secret = self.root / "secret-key"
        if not secret.exists():
            secret.write_text("a-secret-key-both-hosts-share-" + os.urandom(16).hex())
        env.update(
            LLMGW_DATABASE_URL=database_url,
            LLMGW_REDIS_URL=redis_url,
            LLMGW_SECRET_KEY_FILE=str(secret),
            LLMGW_DATA_DIR=str(host.data),
            LLMGW_ADMIN_ADDR=host.admin,
            LLMGW_GATEWAY_ADDR=host.gateway,
            LLMGW_GATEWAY_WORKERS="1",
            LLMGW_ALLOWED_HOSTS="*",
            LLMGW_PATRONI_URL=f"http://127.0.0.1:{self.ports['pg1-rest']}",
            LLMGW_GATEWAY_REFRESH_S="0.5",
            # The beat's lease reaper every REAP_EVERY_S rather than every minute, so that scenario 2 sees a
            # dead host's reservations back within its lease. It only gives back leases already dead (their
            # holder's renewals stopped), so running it often changes nothing for a living host.
            LLMGW_EVERY_REAP_LEASES=str(REAP_EVERY_S),
            PYTHONUNBUFFERED="1",
        )
        return env

    def start_host(self, host: Host, env: dict[str, str], beat: bool) -> None:
        """The host's units (deploy/systemd): serve, its worker, and the beat where asked."""
        units = ["llmgw-serve", "llmgw-worker"] + (["llmgw-beat"] if beat else [])
        for unit in units:
            cmd = unit_command(unit)
            if unit == "llmgw-worker":
                cmd += ["-n", f"{host.name}@%h"]
            host.procs.append(self.start(f"{host.name}-{unit}", cmd, env=env, restart_s=unit_restart_s(unit)))
            if unit == "llmgw-serve":
                wait_until(lambda: healthy(host.admin), 120, f"{host.name}'s /healthz")

    def restart_host(self, host: Host, env: dict[str, str]) -> None:
        """The host's units stopped (SIGTERM, as systemd does) and started again on ``env``; old logs kept aside."""
        for proc in host.procs:
            proc.stop()
            self.procs.remove(proc)
            proc.log.rename(proc.log.with_suffix(".log.before-restart"))
        host.procs.clear()
        self.start_host(host, env, beat=False)


@dataclass
class Host:
    """One control host: its listeners, data dir and processes."""

    name: str
    data: Path
    admin: str = field(default_factory=lambda: f"127.0.0.1:{free_port()}")
    gateway: str = field(default_factory=lambda: f"127.0.0.1:{free_port()}")
    procs: list[Proc] = field(default_factory=list)


def unit_command(unit: str) -> list[str]:
    """The unit's ExecStart, with /opt/llmgw/bin's programs run from this interpreter."""
    line = next(
        x for x in (DEPLOY / "systemd" / f"{unit}.service").read_text().splitlines() if x.startswith("ExecStart=")
    )
    program, *args = shlex.split(line.removeprefix("ExecStart="))
    module = {"/opt/llmgw/bin/llmgw": "llmgw.cli", "/opt/llmgw/bin/celery": "celery"}[program]
    return [sys.executable, "-m", module, *args]


def unit_restart_s(unit: str) -> float:
    """The unit's RestartSec (systemd's default, 0.1 s, where it has none); every llmgw unit has Restart=always."""
    text = (DEPLOY / "systemd" / f"{unit}.service").read_text()
    assert "\nRestart=always" in text, f"{unit} is not restarted by systemd: the harness would keep it up wrongly"
    line = next((x for x in text.splitlines() if x.startswith("RestartSec=")), "RestartSec=0.1")
    return float(line.removeprefix("RestartSec=").removesuffix("s"))


def healthy(address: str) -> bool:
    try:
        return httpx.get(f"http://{address}/healthz", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def redis_answers(port: int) -> bool:
    with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
        sock.sendall(b"PING\r\n")
        return sock.recv(16).startswith(b"+PONG")


def leader_through(port: int) -> bool:
    """Whether a connection to ``port`` reaches a PostgreSQL that is not in recovery (the leader)."""
    done = subprocess.run(
        [
            "psql",
            "-h",
            "127.0.0.1",
            "-p",
            str(port),
            "-U",
            "postgres",
            "-d",
            "postgres",
            "-Atc",
            "select pg_is_in_recovery()",
        ],
        env={**os.environ, "PGPASSWORD": SUPERUSER_PASSWORD, "PGCONNECT_TIMEOUT": "2"},
        capture_output=True,
        text=True,
    )
    return done.stdout.strip() == "f"


def pg_bin_dir() -> str:
    versions = sorted(Path("/usr/lib/postgresql").iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else 0)
    return str(versions[-1] / "bin")
