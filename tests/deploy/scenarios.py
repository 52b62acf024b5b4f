"""The failure scenarios of issue #17, run against a tests/deploy/multihost.py cluster.

Each scenario returns a :class:`Figures` row (what bench/failover.py prints)
and the raw observations its test asserts on; the tests
(tests/deploy/test_multihost.py) and the bench share one cluster, started by
:func:`build` and given a fleet and a gateway key by :func:`populate`.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import websocket

from tests.deploy.multihost import (
    REAP_EVERY_S,
    SUPERUSER_PASSWORD,
    Cluster,
    Host,
    free_port,
    healthy,
    wait_until,
)

CLIENTS = 8
LIMITED_RPM = 20
"""Requests a minute the ``limited`` team may make (scenario 4 counts them with Redis away)."""
BUDGET_MICROS = 2000
"""The ``budgeted`` team's budget: at a micro a token, about twenty of scenario 5's requests' reservations."""
BUDGET_REQUESTS = 50
SLOW_TOKENS, SLOW_TOKEN_DELAY_S = 400, 0.05
"""The slow engine's answers: 400 tokens streamed 0.05 s apart, 20 s in all (scenario 2's reservations)."""
DEAD_HOST_LEASE_S = 5.0
"""LLMGW_GATEWAY_LEASE_S of the host scenario 2 kills, given it when it is restarted for that scenario."""
CHECKOUT = str(Path(__file__).resolve().parents[2])


@dataclass
class Figures:
    """One row of the bench's table."""

    scenario: str
    sent: int
    failed: int
    lost: int
    recover_s: float | None
    note: str = ""


@dataclass
class Fleet:
    """What the scenarios need of a populated cluster."""

    cluster: Cluster
    token: str
    join: str
    key: str
    nodes: int
    agents: object = None
    extra: dict = field(default_factory=dict)

    @property
    def admin(self) -> str:
        return f"http://127.0.0.1:{self.cluster.ports['haproxy-admin']}"

    @property
    def gateway(self) -> str:
        return f"http://127.0.0.1:{self.cluster.ports['haproxy-gateway']}"

    def api(self, method: str, path: str, **kwargs) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.token}"}
        return httpx.request(method, f"{self.admin}/api/v1/{path}", headers=headers, timeout=10, **kwargs)

    def summary(self) -> dict:
        answer = self.api("GET", "summary")
        answer.raise_for_status()
        return answer.json()


def build(root: Path | None = None) -> Cluster:
    """etcd, Patroni's two PostgreSQL, a Redis of its own, HAProxy and two control hosts (ctl1 runs the beat)."""
    root = root or Path(tempfile.mkdtemp(prefix="llmgw-multihost-"))
    os.chmod(root, 0o755)
    built = Cluster(root)
    try:
        built.start_etcd()
        built.start_patroni("pg1")
        built.start_patroni("pg2")
        built.wait_replicated()
        redis_url = built.start_redis()
        hosts = [Host("ctl1", root / "ctl1"), Host("ctl2", root / "ctl2")]
        built.start_haproxy(hosts)
        database_url = built.create_database()
        built.database_url = database_url
        envs = [built.host_env(h, database_url, redis_url) for h in hosts]
        built.start_host(hosts[0], envs[0], beat=True)
        built.start_host(hosts[1], envs[1], beat=False)
        built.hosts, built.envs = hosts, envs
    except BaseException:
        built.close()
        raise
    return built


def discard(cluster: Cluster) -> None:
    cluster.close()
    # LLMGW_KEEP_MULTIHOST=1 keeps the logs (every process's, HAProxy's) to read after a failure.
    if not os.environ.get("LLMGW_KEEP_MULTIHOST"):
        shutil.rmtree(cluster.root, ignore_errors=True)


def shell(cluster: Cluster, code: str, timeout: float = 120) -> str:
    """Python run in host 1's Django shell (this checkout on its path, for tests' helpers); its output."""
    env = {**cluster.envs[0], "PYTHONPATH": os.pathsep.join(filter(None, [CHECKOUT, os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(
        [sys.executable, "-m", "llmgw.cli", "shell", "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def sql(cluster: Cluster, query: str) -> str:
    """One query on the leader through HAProxy, as llmgw's own role; its rows as psql -At prints them."""
    done = subprocess.run(
        ["psql", cluster.database_url, "-Atc", query],
        env={**os.environ, "PGCONNECT_TIMEOUT": "3"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


FOUND = ("KEY", "LIMITED", "BUDGETED", "SLOW")
"""What populate's shell prints, NAME=key."""


def populate(cluster: Cluster, nodes: int, heartbeat_s: float = 2) -> Fleet:
    """A fake engine serving ``llama``, a key for it, and ``nodes`` simulated agents, all ready."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [CHECKOUT, os.environ.get("PYTHONPATH")]))}
    slow = free_port()
    cluster.start("engine", [sys.executable, "-m", "tests.gateway.fake_engine", "--port", str(port)], env=env)
    engine = [sys.executable, "-m", "tests.gateway.fake_engine", "--port", str(slow), "--tokens", str(SLOW_TOKENS)]
    cluster.start("slow-engine", [*engine, "--token-delay", str(SLOW_TOKEN_DELAY_S)], env=env)
    for p in (port, slow):
        wait_until(lambda p=p: httpx.get(f"http://127.0.0.1:{p}/v1/models", timeout=1).status_code == 200, 30, "engine")
    out = shell(
        cluster,
        "from tests.gateway.harness import key, model, replica\n"
        f"replica(model('llama'), 'http://127.0.0.1:{port}')\n"
        "print('KEY=' + key())\n"
        "print('LIMITED=' + key(team='limited'))\n"
        "from gateway.models import Budget, Team\n"
        f"Team.objects.filter(name='limited').update(rpm={LIMITED_RPM})\n"
        # A priced model on the same engine, and a team whose budget scenario 5 runs out.
        f"replica(model('priced', price=(1_000_000, 1_000_000)), 'http://127.0.0.1:{port}')\n"
        "print('BUDGETED=' + key(team='budgeted'))\n"
        f"Budget.objects.create(scope='team', team=Team.objects.get(name='budgeted'), amount_micros={BUDGET_MICROS},"
        " period='day')\n"
        # A slow priced model (a micro a completion token) and a team with a budget: scenario 2's reservations.
        f"replica(model('slow', price=(0, 1_000_000)), 'http://127.0.0.1:{slow}')\n"
        "print('SLOW=' + key(team='slow'))\n"
        "Budget.objects.create(scope='team', team=Team.objects.get(name='slow'), amount_micros=1_000_000,"
        " period='day')\n",
    )
    found = dict(line.split("=", 1) for line in out.splitlines() if line.split("=", 1)[0] in FOUND)
    key = found["KEY"]
    data = cluster.hosts[0].data
    fleet = Fleet(
        cluster, (data / "admin-token").read_text().strip(), (data / "join-token").read_text().strip(), key, nodes
    )
    fleet.extra.update(limited=found["LIMITED"], budgeted=found["BUDGETED"], slow=found["SLOW"])
    fleet.agents = cluster.start(
        "agents",
        [
            sys.executable,
            "-m",
            "llmgw.cli",
            "simulate",
            "--server",
            fleet.admin,
            "--join-token",
            fleet.join,
            "--fleet",
            f"h100-hgx:{nodes}",
            "--heartbeat",
            str(heartbeat_s),
        ],
    )
    wait_until(lambda: fleet.summary()["nodes"]["ready"] == nodes, 180, f"{nodes} nodes ready", 1)
    return fleet


class Clients:
    """Threads sending chat completions through HAProxy until stopped; each answer's status kept."""

    def __init__(self, url: str, key: str, clients: int = CLIENTS) -> None:
        self.url, self.key = url, key
        self.results: list[tuple[float, float, int | str, int]] = []
        """(sent, answered, status or the exception's name, which client)."""
        self.bodies: dict[int, list[str]] = {}
        """Answers that were not 200, by status: their bodies (the first few)."""
        self.bare_503 = 0
        """503s without Retry-After (from llmgw or HAProxy, every one answers with it)."""
        self.stopping = threading.Event()
        self.threads = [threading.Thread(target=self.run, args=(n,), daemon=True) for n in range(clients)]

    def run(self, client: int) -> None:
        body = {"model": "llama", "messages": [{"role": "user", "content": "hi"}]}
        with httpx.Client(timeout=30, headers={"Authorization": f"Bearer {self.key}"}) as http:
            while not self.stopping.is_set():
                sent = time.monotonic()
                try:
                    answer = http.post(f"{self.url}/v1/chat/completions", json=body)
                    status: int | str = answer.status_code
                    if status == 503 and "retry-after" not in answer.headers:
                        self.bare_503 += 1
                    if status != 200 and len(self.bodies.setdefault(status, [])) < 3:
                        self.bodies[status].append(
                            f"Retry-After {answer.headers.get('retry-after')}: {answer.text[:600]}"
                        )
                except httpx.HTTPError as exc:
                    status = type(exc).__name__
                self.results.append((sent, time.monotonic(), status, client))

    def ok(self) -> int:
        return sum(1 for r in self.results if r[2] == 200)

    def __enter__(self) -> Clients:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopping.set()
        for t in self.threads:
            t.join(60)


OK_RECORDS = (
    "select count(*) from gateway_usagerecord u join gateway_team t on t.id = u.team_id"
    " where t.name = '{team}' and u.status = 200"
)
DB_WINDOWS = "select coalesce(sum(requests), 0) from gateway_ratewindow"
"""Requests the rate limits counted in the database (they do while Redis is away)."""


def ok_records(cluster: Cluster, team: str = "search") -> int:
    """Usage records of the team's answered requests (status 200) in the database."""
    return int(sql(cluster, OK_RECORDS.format(team=team)))


def settled(cluster: Cluster, expected: int, team: str = "search", timeout: float = 30) -> int:
    """The team's 200 records once they reach ``expected`` (the writers flush every second), or as they are then."""
    with contextlib.suppress(AssertionError):
        wait_until(lambda: ok_records(cluster, team) >= expected, timeout, "usage written", 0.5)
    return ok_records(cluster, team)


def chats(fleet: Fleet, key: str, count: int) -> list[int]:
    """The statuses of ``count`` chat completions sent one after another with ``key``."""
    body = {"model": "llama", "messages": [{"role": "user", "content": "hi"}]}
    with httpx.Client(timeout=30, headers={"Authorization": f"Bearer {key}"}) as http:
        return [http.post(f"{fleet.gateway}/v1/chat/completions", json=body).status_code for _ in range(count)]


# --- the console's live page, as a browser holds it ---------------------------------------------------------


def console_session(fleet: Fleet) -> str:
    """A logged-in operator's session cookie (the admin login form, as a browser posts it)."""
    password = (fleet.cluster.hosts[0].data / "admin-password").read_text().strip()
    with httpx.Client(base_url=fleet.admin, timeout=10) as http:
        page = http.get("/admin/login/")
        csrf = page.text.split('name="csrfmiddlewaretoken" value="', 1)[1].split('"', 1)[0]
        done = http.post(
            "/admin/login/?next=/admin/",
            data={"csrfmiddlewaretoken": csrf, "username": "admin", "password": password, "next": "/admin/"},
            headers={"Referer": f"{fleet.admin}/admin/login/"},
        )
        assert done.status_code == 302, done.text[:300]
        return http.cookies["sessionid"]


class LivePage:
    """A fleet page's websocket through HAProxy, reconnecting when closed as the console's script does."""

    def __init__(self, fleet: Fleet) -> None:
        self.url = f"ws://127.0.0.1:{fleet.cluster.ports['haproxy-admin']}/ws/console/fleet/"
        self.cookie = f"sessionid={console_session(fleet)}"
        self.messages: list[tuple[float, dict]] = []
        self.connects: list[float] = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:

        while not self.stopping.is_set():
            try:
                sock = websocket.create_connection(self.url, timeout=1, cookie=self.cookie)
            except Exception:  # noqa: BLE001 - the page retries, as the console's does
                time.sleep(0.5)
                continue
            self.connects.append(time.monotonic())
            try:
                while not self.stopping.is_set():
                    try:
                        text = sock.recv()
                    except websocket.WebSocketTimeoutException:
                        continue
                    if not text:
                        break
                    self.messages.append((time.monotonic(), json.loads(text)))
            except Exception:  # noqa: BLE001 - closed or broken: connect again
                pass
            finally:
                sock.close()
            time.sleep(0.5)

    def heard(self, kind: str, since: float) -> float | None:
        """When the first message of ``kind`` after ``since`` arrived, if one has.

        Inside a batch as well; a resync (too many to list) tells the page of everything.
        """

        def kinds(frame: dict) -> list[str]:
            if frame.get("kind") == "batch":
                return [u.get("kind") for u in frame.get("data", {}).get("updates", [])]
            return [kind] if frame.get("kind") == "resync" else [frame.get("kind")]

        return min((t for t, m in self.messages if t > since and kind in kinds(m)), default=None)

    def __enter__(self) -> LivePage:
        self.thread.start()
        wait_until(lambda: self.connects, 30, "the live page's websocket")
        return self

    def __exit__(self, *exc) -> None:
        self.stopping.set()
        self.thread.join(10)


def register_one(fleet: Fleet, name: str) -> None:
    """One more simulated node (a prefix of its own), so that the live page has something to hear."""
    fleet.cluster.start(
        f"agent-{name}",
        [
            sys.executable,
            "-m",
            "llmgw.cli",
            "simulate",
            "--server",
            fleet.admin,
            "--join-token",
            fleet.join,
            "--prefix",
            f"{name}-",
            "--fleet",
            "cpu:1",
            "--heartbeat",
            "2",
        ],
    )


def log_lines(cluster: Cluster, words: str) -> dict[str, int]:
    """How many lines of each llmgw process's log contain ``words``."""
    return {
        log.stem: sum(words in line for line in log.read_text(errors="replace").splitlines())
        for log in sorted(cluster.root.glob("ctl*.log"))
    }


def outage_lines(cluster: Cluster) -> dict[str, tuple[int, int]]:
    """core.outage's lines about Redis in the llmgw logs: (went, came back) for each log and process id."""
    said: dict[str, list[int]] = {}
    for log in sorted(cluster.root.glob("ctl*.log")):
        for line in log.read_text(errors="replace").splitlines():
            if "llmgw.outage: [pid " in line and "Redis is" in line:
                pid = line.split("[pid ", 1)[1].split("]", 1)[0]
                counts = said.setdefault(f"{log.stem}:{pid}", [0, 0])
                counts["Redis is back" in line] += 1
    return {k: (went, back) for k, (went, back) in said.items()}


def redis_outage(fleet: Fleet, outage_s: float) -> tuple[Figures, dict]:
    """Scenario 4: Redis stopped for ``outage_s`` under gateway load, with a rate-limited key and a live page."""
    cluster = fleet.cluster
    limited = fleet.extra["limited"]
    before_records = ok_records(cluster)
    seen = {}
    with LivePage(fleet) as page, Clients(fleet.gateway, fleet.key) as clients:
        time.sleep(3)
        cluster.stop_redis()
        stopped = time.monotonic()
        time.sleep(min(5.0, outage_s / 2))
        # Rate limits counted in the database: the limited key's team allows LIMITED_RPM a minute.
        with httpx.Client(timeout=30, headers={"Authorization": f"Bearer {limited}"}) as http:
            body = {"model": "llama", "messages": [{"role": "user", "content": "hi"}]}
            seen["limited_while_down"] = [
                http.post(f"{fleet.gateway}/v1/chat/completions", json=body).status_code
                for _ in range(LIMITED_RPM + 10)
            ]
        seen["windows_while_down"] = sql(cluster, "select coalesce(sum(requests), 0) from gateway_ratewindow")
        time.sleep(max(0.0, outage_s - (time.monotonic() - stopped)))
        cluster.start_redis()
        restarted = time.monotonic()
        # Back: the first gateway answer after the restart, and the first live message after a registration.
        register_one(fleet, f"live{int(restarted)}")
        wait_until(
            # Inside a batch too: a registration is two messages, and the page's socket may send them as one.
            lambda: page.heard("node.registered", restarted) is not None,
            60,
            "a live message after Redis came back",
            0.2,
        )
        heard = page.heard("node.registered", restarted)
        # Rate limits back in Redis: the limited key's requests no longer touch the database's windows.
        time.sleep(3)
        windows = sql(cluster, "select coalesce(sum(requests), 0) from gateway_ratewindow")
        with httpx.Client(timeout=30, headers={"Authorization": f"Bearer {limited}"}) as http:
            body = {"model": "llama", "messages": [{"role": "user", "content": "hi"}]}
            seen["limited_after"] = [
                http.post(f"{fleet.gateway}/v1/chat/completions", json=body).status_code for _ in range(5)
            ]
        seen["windows_grew_after"] = int(
            sql(cluster, "select coalesce(sum(requests), 0) from gateway_ratewindow")
        ) - int(windows)
        # Every process that said Redis went says it is back once it uses it again (a worker's consumer
        # reconnects on its own back-off, a few seconds after the restart).
        with contextlib.suppress(AssertionError):
            wait_until(lambda: all(w == b for w, b in outage_lines(cluster).values()), 60, "every process back", 0.5)
        seen["all_back_s"] = time.monotonic() - restarted
    ok = clients.ok()
    records = settled(cluster, before_records + ok) - before_records
    failed = [r for r in clients.results if r[2] != 200]
    seen.update(
        clients=clients,
        records=records,
        ok=ok,
        live_after_s=heard - restarted,
        reconnects=sum(1 for t in page.connects if t > stopped),
        said=outage_lines(cluster),
        units=cluster.states(),
        tracebacks=log_lines(cluster, "Traceback"),
        nodes=fleet.summary()["nodes"],
    )
    figures = Figures(
        f"4. Redis stopped {outage_s:.0f} s",
        len(clients.results),
        len(failed),
        ok - records,
        heard - restarted,
        f"live page heard again {heard - restarted:.1f} s after the restart",
    )
    return figures, seen


def budgets_across_hosts(fleet: Fleet) -> tuple[Figures, dict]:
    """Scenario 5: BUDGET_REQUESTS requests at once, half to each host's gateway, against one team budget."""
    cluster = fleet.cluster
    key = fleet.extra["budgeted"]
    body = {"model": "priced", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16}
    start = threading.Barrier(BUDGET_REQUESTS)
    statuses: list[int | str] = [0] * BUDGET_REQUESTS

    def one(n: int) -> None:
        host = cluster.hosts[n % 2]
        with httpx.Client(timeout=30, headers={"Authorization": f"Bearer {key}"}) as http:
            start.wait()
            try:
                statuses[n] = http.post(f"http://{host.gateway}/v1/chat/completions", json=body).status_code
            except httpx.HTTPError as exc:
                statuses[n] = type(exc).__name__

    threads = [threading.Thread(target=one, args=(n,)) for n in range(BUDGET_REQUESTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    accepted = statuses.count(200)
    budget = "(select id from gateway_team where name = 'budgeted')"
    query = f"select spent_micros, reserved_micros, amount_micros from gateway_budget where team_id = {budget}"
    # Usage is flushed within a second; its reservations are given back with it.
    wait_until(lambda: sql(cluster, query).split("|")[1] == "0", 30, "the reservations given back", 0.5)
    spent, reserved, amount = (int(x) for x in sql(cluster, query).split("|"))
    records, cost = (
        int(x)
        for x in sql(
            cluster, f"select count(*), coalesce(sum(cost_micros), 0) from gateway_usagerecord where team_id = {budget}"
        ).split("|")
    )
    seen = dict(statuses=statuses, spent=spent, reserved=reserved, amount=amount, records=records, cost=cost)
    figures = Figures(
        "5. one budget, both hosts",
        BUDGET_REQUESTS,
        sum(1 for s in statuses if s not in (200, 429)),
        BUDGET_REQUESTS - records,
        None,
        f"{accepted} accepted, {statuses.count(429)} refused (429); spent {spent} of {amount} micros",
    )
    return figures, seen


class HeartbeatWatch:
    """Polls the newest heartbeat the database holds (every 0.5 s, through HAProxy), to see when beats land again."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.seen: list[tuple[float, float | None]] = []
        """(when, the newest last_seen as epoch seconds, or None when the database did not answer)."""
        self.most_unreachable = 0
        """The most nodes marked unreachable at one poll."""
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        while not self.stopping.is_set():
            query = (
                "select extract(epoch from max(last_seen)), count(*) filter (where not reachable) from inventory_node"
            )
            try:
                newest, unreachable = sql(self.cluster, query).split("|")
                value: float | None = float(newest)
                self.most_unreachable = max(self.most_unreachable, int(unreachable))
            except (AssertionError, subprocess.TimeoutExpired, ValueError):
                value = None
            self.seen.append((time.monotonic(), value))
            self.stopping.wait(0.5)

    def landed_after(self, at: float, wall: float) -> float | None:
        """Seconds from ``at`` (monotonic) to the first poll showing a beat written after ``wall`` (epoch)."""
        return next((t - at for t, v in self.seen if t > at and v is not None and v > wall), None)

    def __enter__(self) -> HeartbeatWatch:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopping.set()
        self.thread.join(10)


def leader(cluster: Cluster) -> str:
    return next(m["name"] for m in cluster.members() if m["role"] == "leader")


def patronictl(cluster: Cluster, *args: str) -> str:
    config = cluster.root / "pg1" / "patroni.yml"
    done = subprocess.run(["patronictl", "-c", str(config), *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def llmgw_sessions(cluster: Cluster, member: str) -> int:
    """Connections of llmgw's role held on ``member`` itself (not through HAProxy)."""
    done = subprocess.run(
        [
            "psql",
            "-h",
            "127.0.0.1",
            "-p",
            str(cluster.ports[f"{member}-pg"]),
            "-U",
            "postgres",
            "-d",
            "postgres",
            "-Atc",
            "select count(*) from pg_stat_activity where usename = 'llmgw'",
        ],
        env={**os.environ, "PGPASSWORD": SUPERUSER_PASSWORD, "PGCONNECT_TIMEOUT": "3"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    return int(done.stdout.strip()) if done.returncode == 0 else -1


def database_change(fleet: Fleet, what: str, settle_s: float = 15) -> tuple[Figures, dict]:
    """Scenario 3, one half: ``what`` is ``switchover`` (patronictl) or ``failover`` (the leader SIGKILLed)."""
    cluster = fleet.cluster
    # A leader and a synchronous standby first: after the switchover the old leader rejoins as one.
    cluster.wait_replicated()
    before_records = ok_records(cluster)
    old = leader(cluster)
    other = next(m["name"] for m in cluster.members() if m["name"] != old)
    with HeartbeatWatch(cluster) as beats, Clients(fleet.gateway, fleet.key) as clients:
        time.sleep(3)
        at, wall = time.monotonic(), time.time()
        if what == "switchover":
            patronictl(cluster, "switchover", "--leader", old, "--candidate", other, "--force")
        else:
            # Patroni and its PostgreSQL together, as a host that lost power: the leader key runs out (ttl).
            next(p for p in cluster.procs if p.name == f"patroni-{old}").kill(signal.SIGKILL)
            postmaster = cluster.root / old / "data" / "postmaster.pid"
            with contextlib.suppress(FileNotFoundError, ProcessLookupError, ValueError):
                os.kill(int(postmaster.read_text().split()[0]), signal.SIGKILL)
        wait_until(lambda: leader(cluster) == other, 120, f"{other} leading", 0.5)
        elected = time.monotonic() - at
        wait_until(lambda: beats.landed_after(at, wall + elected), 120, "heartbeats written again", 0.5)
        time.sleep(settle_s)
        old_sessions = llmgw_sessions(cluster, old) if what == "switchover" else None
        # Agents heartbeat through a failover (their reports answered 503 wait for Retry-After): no node
        # should be marked unreachable; this says when every one is (test_multihost asserts none ever was).
        nodes_whole = None
        with contextlib.suppress(AssertionError):
            wait_until(lambda: fleet.summary()["nodes"]["unreachable"] == 0, 120, "every node reachable", 1)
            nodes_whole = time.monotonic() - at
    ok = clients.ok()
    records = settled(cluster, before_records + ok) - before_records
    after = [r for r in clients.results if r[1] >= at]
    failed = [r for r in after if r[2] != 200]
    last_failure = max((r[1] - at for r in failed), default=0.0)
    beats_back = beats.landed_after(at, wall + elected)
    seen = dict(
        clients=clients,
        ok=ok,
        records=records,
        timed_out=sum(1 for r in failed if r[2] == "ReadTimeout"),
        old=old,
        new=other,
        elected_s=elected,
        gateway_back_s=last_failure,
        beats_back_s=beats_back,
        old_sessions=old_sessions,
        nodes_whole_s=nodes_whole,
        most_unreachable=beats.most_unreachable,
        statuses=sorted({r[2] for r in failed}, key=str),
        nodes=fleet.summary()["nodes"],
    )
    figures = Figures(
        f"3. Patroni {what}",
        len(clients.results),
        len(failed),
        max(0, ok - records),
        max(last_failure, beats_back or 0.0),
        f"{other} leading after {elected:.1f} s; gateway failing for {last_failure:.1f} s "
        f"({', '.join(map(str, seen['statuses'])) or 'none'}), heartbeats written again after {beats_back:.1f} s, "
        f"at most {beats.most_unreachable} nodes unreachable, all reachable by {nodes_whole or float('nan'):.1f} s",
    )
    return figures, seen


PERIODIC_CHECKED = {"observability.tasks.tick": 10.0, "inventory.tasks.check_reachability": 5.0}
"""Periodic tasks only the beat queues, with their periods (llmgw.celery.PERIODIC): each run's start checked."""
RECONCILE, RECONCILE_EVERY_S = "placement.tasks.reconcile", 5.0
"""The reconciler: queued by the beat and also soon after a change (placement.signals), so only its gaps count."""

RUN_LOG = """
create table if not exists scenario_task_starts (name text not null, started timestamptz not null);
create or replace function scenario_task_started() returns trigger language plpgsql as $$
begin
  if new.last_started is distinct from old.last_started then
    insert into scenario_task_starts values (new.name, new.last_started);
  end if;
  return new;
end $$;
drop trigger if exists scenario_task_started on core_taskrun;
create trigger scenario_task_started after update on core_taskrun for each row execute function scenario_task_started();
"""
"""Every start of a task (each worker sets TaskRun.last_started as a run begins), kept by the database itself:
exact whatever the load, where polling the row could miss two runs between polls."""


def record_task_starts(cluster: Cluster) -> None:
    sql(cluster, RUN_LOG)


def task_starts(cluster: Cluster) -> dict[str, list[float]]:
    """Each task's recorded starts, epoch seconds, in order."""
    rows = sql(cluster, "select name, extract(epoch from started) from scenario_task_starts order by started")
    starts: dict[str, list[float]] = {}
    for line in rows.splitlines():
        name, at = line.split("|")
        starts.setdefault(name, []).append(float(at))
    return starts


def gaps(starts: list[float]) -> list[float]:
    return [b - a for a, b in itertools.pairwise(starts)]


class SlowStreams:
    """Streamed completions of the slow priced model sent straight to given hosts' gateways, read to the end."""

    def __init__(self, key: str, addresses: list[str]) -> None:
        self.key = key
        self.results: dict[int, tuple[str, int | str, int]] = {}
        """Per stream: (the host's address, its status or exception's name, the tokens it got)."""
        self.threads = [threading.Thread(target=self.run, args=(n, a), daemon=True) for n, a in enumerate(addresses)]
        for t in self.threads:
            t.start()

    def run(self, n: int, address: str) -> None:
        body = {"model": "slow", "stream": True, "max_tokens": 500, "messages": [{"role": "user", "content": "go"}]}
        got, status = 0, "not sent"
        try:
            with (
                httpx.Client(timeout=60, headers={"Authorization": f"Bearer {self.key}"}) as http,
                http.stream("POST", f"http://{address}/v1/chat/completions", json=body) as answer,
            ):
                status = answer.status_code
                for line in answer.iter_lines():
                    if line.startswith("data: {") and json.loads(line.removeprefix("data: ")).get("choices"):
                        got += 1
        except httpx.HTTPError as exc:
            status = type(exc).__name__
        self.results[n] = (address, status, got)

    def join(self, timeout: float) -> None:
        for t in self.threads:
            t.join(timeout)


SLOW_BUDGET = "(select id from gateway_budget where team_id = (select id from gateway_team where name = 'slow'))"


def leases(cluster: Cluster) -> dict[str, int]:
    """The slow team's budget's leases: owner (host:pid:random) to the micros it holds."""
    rows = sql(cluster, f"select owner, micros from gateway_lease where budget_id = {SLOW_BUDGET}")
    return {owner: int(micros) for owner, micros in (line.split("|") for line in rows.splitlines())}


def slow_budget(cluster: Cluster) -> tuple[int, int]:
    """The slow team's budget: (spent, reserved) micros."""
    query = f"select spent_micros, reserved_micros from gateway_budget where id = {SLOW_BUDGET}"
    spent, reserved = sql(cluster, query).split("|")
    return int(spent), int(reserved)


LEASE_ROWS = (
    "select l.owner, l.micros, l.expires_at - now(), h.expires_at - now() from gateway_lease l"
    " left join gateway_leaseholder h on h.owner = l.owner"
)
"""Every lease, its holder's expiry and its own (from now), to say why one was not given back."""


def owned_by(host_procs, owner: str) -> bool:
    """Whether the lease owner's process (``host:pid:random``) is in one of the host's process groups."""
    pid = int(owner.split(":")[1])
    try:
        return os.getpgid(pid) in {p.popen.pid for p in host_procs}
    except ProcessLookupError:
        return False


def refused(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=1).close()
    except ConnectionRefusedError:
        return True
    return False


def host_killed(fleet: Fleet, watch_s: float = 30) -> tuple[Figures, dict]:
    """Scenario 2: the host without the beat SIGKILLed under gateway load, holding budget reservations.

    1. Each task's starts recorded from here on (RUN_LOG), across the restart and the kill.
    2. The host restarted with a lease of DEAD_HOST_LEASE_S. The lease is stamped by the process that
       reserves (its own LLMGW_GATEWAY_LEASE_S, renewed by it), so a short one on this host alone keeps the
       test short and changes nothing for the other host, nor for the earlier scenarios: during a 30 s
       Patroni failover no lease can be renewed, and one this short would have been reaped from under
       requests still in flight.
    3. Clients through HAProxy; slow priced streams straight to each host (20 s each), held past a lease.
    4. The host's every process SIGKILLed; for ``watch_s``: when its leases are given back, the nodes.
    """
    cluster, dead = fleet.cluster, fleet.cluster.hosts[1]
    record_task_starts(cluster)
    recorded_from = time.time()
    cluster.restart_host(dead, {**cluster.envs[1], "LLMGW_GATEWAY_LEASE_S": str(DEAD_HOST_LEASE_S)})
    routed = cluster.root / "haproxy.log"
    seen: dict = {}
    with Clients(fleet.gateway, fleet.key) as clients:
        # HAProxy sends the restarted host traffic again (two good checks, 2 s apart) before it is killed. Its
        # gateway's processes start after the admin listener answers: on a loaded machine, seconds after.
        mark = routed.read_text().count("llmgw_gateway/ctl2 ")
        wait_until(lambda: healthy(dead.gateway), 120, "the restarted host's gateway", 0.5)
        wait_until(lambda: routed.read_text().count("llmgw_gateway/ctl2 ") > mark, 60, "ctl2 routed to again", 0.5)
        # Each periodic task's runs are judged from a period before the kill, and the kill comes `ahead`
        # seconds from here at the soonest: on a quick machine the restart above takes a few seconds, and a
        # task with a longer period may not have started since the recording began (the stop-26 CI run: the
        # tick's first start 5.4 s before the kill). Wait here, not before the kill: the streams must still
        # be in flight when it comes.
        ahead = DEAD_HOST_LEASE_S + 2 * REAP_EVERY_S

        def each_task_ran_a_period_before_the_kill() -> bool:
            now, starts = time.time(), task_starts(cluster)
            return all(
                any(recorded_from <= t <= now + ahead - period - 1 for t in starts.get(task, []))
                for task, period in PERIODIC_CHECKED.items()
            )

        wait_until(each_task_ran_a_period_before_the_kill, 60, "each periodic task run a period before the kill", 0.5)
        streams = SlowStreams(fleet.extra["slow"], [dead.gateway] * 4 + [cluster.hosts[0].gateway] * 2)
        wait_until(lambda: len(leases(cluster)) == 2 and all(leases(cluster).values()), 30, "both hosts' leases")
        held = {o: m for o, m in leases(cluster).items() if owned_by(dead.procs, o)}
        # Held past a lease and two reaper runs: the living host's renewals keep its reservations.
        time.sleep(DEAD_HOST_LEASE_S + 2 * REAP_EVERY_S)
        held_at_kill = {o: m for o, m in leases(cluster).items() if o in held}
        seen["lease_rows_at_kill"] = sql(cluster, LEASE_ROWS)
        before = len(clients.results)
        killed_at, killed_wall = time.monotonic(), time.time()
        for proc in dead.procs:
            proc.kill(signal.SIGKILL)
        # A killed process still holds its listening socket while the kernel tears it down: connections
        # made meanwhile are in flight on the dead host too. The host is gone once a connect is refused.
        wait_until(lambda: refused(dead.gateway), 10, "the killed host's listener closing", 0.005)
        gone_at = time.monotonic()

        def given_back() -> bool:
            now = leases(cluster)
            return not any(now.get(o) for o in held) and slow_budget(cluster)[1] == sum(now.values())

        with contextlib.suppress(AssertionError):
            wait_until(given_back, watch_s, "the dead host's reservations given back", 0.1)
        back_s = time.monotonic() - killed_at if given_back() else None
        seen["lease_rows"] = sql(cluster, LEASE_ROWS)
        seen["reaper"] = sql(cluster, "select * from core_taskrun where name = 'gateway.tasks.reap_leases'")
        seen["units"] = cluster.states()
        seen["activity"] = sql(
            cluster,
            "select pid, state, wait_event_type, now() - xact_start, left(query, 100) from pg_stat_activity"
            " where datname = current_database() and state <> 'idle'",
        )
        # Longer than a node's grace (20 s): a node that could not reach the other host would be unreachable.
        time.sleep(max(0.0, watch_s - (time.monotonic() - killed_at)))
        nodes = fleet.summary()["nodes"]
    streams.join(60)
    # The living host's streams are settled with their usage (flushed within a second).
    with contextlib.suppress(AssertionError):
        wait_until(lambda: slow_budget(cluster)[1] == 0, 30, "every reservation settled", 0.5)
    spent, reserved = slow_budget(cluster)
    records, cost = (
        int(x)
        for x in sql(
            cluster,
            "select count(*), coalesce(sum(cost_micros), 0) from gateway_usagerecord"
            " where team_id = (select id from gateway_team where name = 'slow')",
        ).split("|")
    )
    starts = {t: [x for x in v if x >= recorded_from] for t, v in task_starts(cluster).items()}
    failed = [(sent, t, s, c) for sent, t, s, c in clients.results if s != 200]
    seen.update(
        clients=clients,
        before=before,
        killed_at=killed_at,
        killed_wall=killed_wall,
        gone_s=gone_at - killed_at,
        dead_gateway=dead.gateway,
        failed=failed,
        gone_at=gone_at,
        nodes=nodes,
        held=held,
        held_at_kill=held_at_kill,
        back_s=back_s,
        streams=dict(streams.results),
        spent=spent,
        reserved=reserved,
        records=records,
        cost=cost,
        starts=starts,
    )
    last = max((t - killed_at for _, t, _, _ in failed), default=0.0)
    checked = [*PERIODIC_CHECKED, RECONCILE]
    spans = {t: gaps(starts[t]) for t in checked if len(starts.get(t, [])) > 1}
    ran = "; ".join(
        f"{task.rsplit('.', 1)[1]} {len(g) + 1} runs {min(g):.1f}-{max(g):.1f} s apart" for task, g in spans.items()
    )
    back = "not" if back_s is None else f"{back_s:.1f} s"
    figures = Figures(
        "2. a control host SIGKILLed",
        len(clients.results),
        len(failed),
        0,
        last,
        f"the last failure {last:.2f} s after the kill; its reservations ({sum(held_at_kill.values())} micros) back "
        f"{back} after it (lease {DEAD_HOST_LEASE_S:g} s, reaper every {REAP_EVERY_S:g} s); spent {spent} = recorded "
        f"{cost}; nodes after {watch_s:.0f} s {nodes}; {ran}",
    )
    return figures, seen
