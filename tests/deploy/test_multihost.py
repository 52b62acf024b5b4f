"""Two control hosts from deploy/'s files on one machine; one of them SIGKILLed under load.

The set-up (tests/deploy/multihost.py): one etcd, two PostgreSQL under
Patroni (a leader and a synchronous standby), HAProxy in front of the
leader and of both hosts' admin and gateway listeners, two ``llmgw serve
--no-worker`` with a Celery worker each, one beat, one Redis. Simulated
agents and gateway clients talk only to HAProxy.

Scenario: the host without the beat is killed (its serve, gateway and
worker, SIGKILL): the agents carry on through the other host, no node
becomes unreachable, and the gateway requests that fail are at most those
that were in flight on the dead host.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import pytest
import redis

from tests.deploy.multihost import Cluster, Host, free_port, wait_until
from tests.deploy.tools import ensure

pytestmark = pytest.mark.slow
REDIS_URL = os.environ.get("LLMGW_TEST_REDIS_URL", "redis://127.0.0.1:6379/3")
NODES = 40
CLIENTS = 8


def need() -> None:
    """The Debian tools of the set-up, installed when missing (as tests/deploy/tools.ensure does); root to run it."""
    if os.geteuid() != 0:
        pytest.skip("Patroni's PostgreSQL runs as the postgres account, which needs root to switch to")
    for command, package in (("etcd", "etcd-server"), ("patroni", "patroni"), ("haproxy", "haproxy")):
        ensure(command, package)
    ensure("psql", "postgresql-client")


@pytest.fixture(scope="module")
def cluster():
    need()
    root = Path(tempfile.mkdtemp(prefix="llmgw-multihost-"))
    os.chmod(root, 0o755)
    redis.Redis.from_url(REDIS_URL).flushdb()
    built = Cluster(root)
    try:
        built.start_etcd()
        built.start_patroni("pg1")
        built.start_patroni("pg2")
        built.wait_replicated()
        hosts = [Host("ctl1", root / "ctl1"), Host("ctl2", root / "ctl2")]
        built.start_haproxy(hosts)
        database_url = built.create_database()
        envs = [built.host_env(h, database_url, REDIS_URL) for h in hosts]
        built.start_host(hosts[0], envs[0], beat=True)
        built.start_host(hosts[1], envs[1], beat=False)
        built.hosts, built.envs = hosts, envs
        yield built
    finally:
        built.close()
        # LLMGW_KEEP_MULTIHOST=1 keeps the logs (every process's, HAProxy's) to read after a failure.
        if not os.environ.get("LLMGW_KEEP_MULTIHOST"):
            shutil.rmtree(root, ignore_errors=True)


def refused(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=1).close()
    except ConnectionRefusedError:
        return True
    return False


def admin_url(cluster: Cluster) -> str:
    return f"http://127.0.0.1:{cluster.ports['haproxy-admin']}"


def gateway_url(cluster: Cluster) -> str:
    return f"http://127.0.0.1:{cluster.ports['haproxy-gateway']}"


def summary(cluster: Cluster, token: str) -> dict:
    answer = httpx.get(f"{admin_url(cluster)}/api/v1/summary", headers={"Authorization": f"Bearer {token}"}, timeout=10)
    answer.raise_for_status()
    return answer.json()


def setup_gateway(cluster: Cluster) -> str:
    """A model served by a fake engine and a key for it, written through host 1's Django shell."""
    port = free_port()
    # The cluster's processes run in its temporary folder; the fake engine is a module of this checkout's tests.
    checkout = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [checkout, os.environ.get("PYTHONPATH")]))}
    cluster.start("engine", [sys.executable, "-m", "tests.gateway.fake_engine", "--port", str(port)], env=env)
    wait_until(lambda: httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=1).status_code == 200, 30, "engine")
    code = (
        "from tests.gateway.harness import key, model, replica\n"
        f"replica(model('llama'), 'http://127.0.0.1:{port}')\n"
        "print('KEY=' + key())\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "llmgw.cli", "shell", "-c", code],
        env=cluster.envs[0],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return next(line[4:] for line in done.stdout.splitlines() if line.startswith("KEY="))


class Clients:
    """CLIENTS threads sending chat completions through HAProxy until stopped; each answer's status kept."""

    def __init__(self, url: str, key: str) -> None:
        self.url, self.key = url, key
        self.results: list[tuple[float, float, int | str, int]] = []
        """(sent, answered, status or the exception's name, which client)."""
        self.stopping = threading.Event()
        self.threads = [threading.Thread(target=self.run, args=(n,), daemon=True) for n in range(CLIENTS)]

    def run(self, client: int) -> None:
        body = {"model": "llama", "messages": [{"role": "user", "content": "hi"}]}
        with httpx.Client(timeout=30, headers={"Authorization": f"Bearer {self.key}"}) as http:
            while not self.stopping.is_set():
                sent = time.monotonic()
                try:
                    status: int | str = http.post(f"{self.url}/v1/chat/completions", json=body).status_code
                except httpx.HTTPError as exc:
                    status = type(exc).__name__
                self.results.append((sent, time.monotonic(), status, client))

    def __enter__(self) -> Clients:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopping.set()
        for t in self.threads:
            t.join(60)


def test_a_control_host_killed_under_load(cluster):
    token = (cluster.hosts[0].data / "admin-token").read_text().strip()
    join = (cluster.hosts[0].data / "join-token").read_text().strip()
    store = summary(cluster, token)["store"]
    assert sorted(m["role"] for m in store) == ["leader", "sync_standby"], store

    key = setup_gateway(cluster)
    cluster.start(
        "agents",
        [
            sys.executable,
            "-m",
            "llmgw.cli",
            "simulate",
            "--server",
            admin_url(cluster),
            "--join-token",
            join,
            "--fleet",
            f"h100-hgx:{NODES}",
            "--heartbeat",
            "2",
        ],
    )
    wait_until(lambda: summary(cluster, token)["nodes"]["ready"] == NODES, 120, f"{NODES} nodes ready")

    with Clients(gateway_url(cluster), key) as clients:
        time.sleep(5)
        before = len(clients.results)
        killed_at = time.monotonic()
        for proc in cluster.hosts[1].procs:
            proc.kill(signal.SIGKILL)
        # A killed process still holds its listening socket while the kernel tears it down: connections
        # made meanwhile are in flight on the dead host too. The host is gone once a connect is refused.
        wait_until(lambda: refused(cluster.hosts[1].gateway), 10, "the killed host's listener closing", 0.005)
        gone_at = time.monotonic()
        # Longer than a node's grace (20 s): a node that could not reach the other host would be unreachable.
        time.sleep(30)
        nodes = summary(cluster, token)["nodes"]
    failed = [(sent, t, s, c) for sent, t, s, c in clients.results if s != 200]
    sent = len(clients.results)
    last = max((t - killed_at for _, t, _, _ in failed), default=0.0)
    print(
        f"\nscenario 2: {sent} gateway requests ({before} before the kill), {len(failed)} failed "
        f"({sorted({s for _, _, s, _ in failed}, key=str)}, the last {last:.2f} s after the kill, the host gone "
        f"{gone_at - killed_at:.3f} s after it); "
        f"nodes after 30 s: {nodes}"
    )
    assert before > 0 and sent > before + 10, "traffic went on through the other host"
    routed = (cluster.root / "haproxy.log").read_text()
    for backend in ("llmgw_admin", "llmgw_gateway"):
        for host in ("ctl1", "ctl2"):
            assert f"{backend}/{host} " in routed, f"HAProxy sent no {backend} request to {host}: both carry traffic"
    assert nodes["unreachable"] == 0 and nodes["ready"] == NODES, nodes
    # Only requests sent before the killed host was gone may fail: those in flight on it.
    assert all(killed_at - 30 < sent <= gone_at for sent, _, _, _ in failed), (
        f"failed after the host was gone: {failed}"
    )
    assert all(killed_at <= t < killed_at + 10 for _, t, _, _ in failed), f"failed before or long after: {failed}"
