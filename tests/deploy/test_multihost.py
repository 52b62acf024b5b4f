"""Two control hosts from deploy/'s files on one machine, and the failures of issue #17 under load.

The set-up (tests/deploy/multihost.py): one etcd, two PostgreSQL under
Patroni (a leader and a synchronous standby), a Redis of its own, HAProxy in
front of the leader and of both hosts' admin and gateway listeners, two
``llmgw serve --no-worker`` with a Celery worker each, one beat. Simulated
agents and gateway clients talk only to HAProxy. One cluster serves every
scenario of the module (tests/deploy/scenarios.py runs them, and
bench/failover.py prints their figures); the host is killed last.
"""

from __future__ import annotations

import os
import signal
import socket
import time

import pytest

from tests.deploy import scenarios
from tests.deploy.multihost import wait_until
from tests.deploy.scenarios import LIMITED_RPM, Clients
from tests.deploy.tools import ensure

pytestmark = pytest.mark.slow
NODES = int(os.environ.get("LLMGW_MULTIHOST_NODES", "40"))
REDIS_OUTAGE_S = float(os.environ.get("LLMGW_MULTIHOST_REDIS_OUTAGE_S", "20"))


def need() -> None:
    """The Debian tools of the set-up, installed when missing (as tests/deploy/tools.ensure does); root to run it."""
    if os.geteuid() != 0:
        pytest.skip("Patroni's PostgreSQL runs as the postgres account, which needs root to switch to")
    for command, package in (
        ("etcd", "etcd-server"),
        ("patroni", "patroni"),
        ("haproxy", "haproxy"),
        ("redis-server", "redis-server"),
    ):
        ensure(command, package)
    ensure("psql", "postgresql-client")


@pytest.fixture(scope="module")
def fleet():
    need()
    cluster = scenarios.build()
    try:
        yield scenarios.populate(cluster, NODES)
    finally:
        scenarios.discard(cluster)


def refused(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=1).close()
    except ConnectionRefusedError:
        return True
    return False


def test_the_store_lists_both_members(fleet):
    store = fleet.summary()["store"]
    assert sorted(m["role"] for m in store) == ["leader", "sync_standby"], store


def test_redis_stopped_under_load(fleet):
    """Scenario 4: nothing refused or lost, limits in the database meanwhile, one log line each way."""
    figures, seen = scenarios.redis_outage(fleet, REDIS_OUTAGE_S)
    print(f"\n{figures}\n{ {k: v for k, v in seen.items() if k != 'clients'} }")
    clients = seen["clients"]
    assert figures.failed == 0, (sorted({r[2] for r in clients.results if r[2] != 200}, key=str), clients.bodies)
    assert seen["records"] == seen["ok"], "every answered request has its usage record"
    # With Redis away the limited team's requests were counted in the database, and refused past its rpm.
    limited = seen["limited_while_down"]
    assert limited.count(200) <= LIMITED_RPM and set(limited) <= {200, 429} and 429 in limited, limited
    assert int(seen["windows_while_down"]) >= limited.count(200)
    # Back in Redis: the limit starts again there (its counts were lost with it) and the database is left alone.
    assert seen["limited_after"] == [200] * 5 and seen["windows_grew_after"] == 0, seen
    assert seen["nodes"]["unreachable"] == 0, seen["nodes"]
    # One line when Redis went and one when it came back, in each process that noticed (every serve, worker
    # and the beat did), and no traceback.
    said = seen["said"]
    assert set(said.values()) == {(1, 1)}, said
    assert {k.split(":")[0] for k in said} == {
        "ctl1-llmgw-serve",
        "ctl1-llmgw-worker",
        "ctl1-llmgw-beat",
        "ctl2-llmgw-serve",
        "ctl2-llmgw-worker",
    }, said
    assert set(seen["tracebacks"].values()) == {0}, seen["tracebacks"]


def test_budgets_hold_across_hosts(fleet):
    """Scenario 5: requests at once through both hosts spend one team budget no further than it goes."""
    figures, seen = scenarios.budgets_across_hosts(fleet)
    print(f"\n{figures}\n{seen}")
    assert set(seen["statuses"]) <= {200, 429} and 429 in seen["statuses"], seen["statuses"]
    # Each request asks for at most 16 tokens, so its reservation covers it: nothing in flight can overrun.
    assert seen["spent"] <= seen["amount"], seen
    # Every request is recorded, the refused ones too; what the accepted cost is what the budget spent.
    assert seen["records"] == len(seen["statuses"]) and seen["cost"] == seen["spent"], seen


@pytest.mark.parametrize("what", ["switchover", "failover"])
def test_the_database_changes_leader_under_load(fleet, what):
    """Scenario 3: a Patroni switchover, then the new leader killed: 503 at most, nothing committed lost."""
    figures, seen = scenarios.database_change(fleet, what)
    print(f"\n{figures}\n{ {k: v for k, v in seen.items() if k != 'clients'} }\n{seen['clients'].bodies}")
    if what == "failover":
        fleet.cluster.restart_patroni(seen["old"])
    assert set(seen["statuses"]) <= {503}, (seen["statuses"], seen["clients"].bodies)
    assert all("Retry-After" in b and "failing over" in b for b in seen["clients"].bodies.get(503, [])), seen
    # HAProxy's own 503 (no host answering /healthz) says the same and when to come back.
    assert seen["clients"].bare_503 == 0, seen["clients"].bare_503
    # Every answered request has its record; there may be more: a request the client gave up on (30 s)
    # while the database was away, answered and recorded once it was back.
    assert seen["records"] >= seen["ok"], "every answered request has its usage record"
    assert seen["beats_back_s"] is not None
    if what == "switchover":
        # HAProxy closed the sessions to the old leader (on-marked-down shutdown-sessions); none was reused.
        assert seen["old_sessions"] == 0, seen
    # The agents' full reports are answered 503 with Retry-After meanwhile; they keep heartbeating (the beats
    # are taken from memory and written once the database is back), so no node was ever marked unreachable.
    assert seen["most_unreachable"] == 0 and seen["nodes"]["unreachable"] == 0, seen


def test_a_control_host_killed_under_load(fleet):
    """Scenario 2: the host without the beat SIGKILLed; the agents carry on, failures are what was in flight."""
    cluster = fleet.cluster
    with Clients(fleet.gateway, fleet.key) as clients:
        time.sleep(5)
        before = len(clients.results)
        killed_at = time.monotonic()
        for proc in cluster.hosts[1].procs:
            proc.kill(signal.SIGKILL)
        # A killed process still holds its listening socket while the kernel tears it down: connections
        # made meanwhile are in flight on the dead host too. The host is gone once a connect is refused.
        wait_until(lambda: refused(cluster.hosts[1].gateway), 10, "the killed host's listener closing", 0.005)
        gone_at = time.monotonic()
        runs_before, counted_from = scenarios.task_runs(cluster), time.monotonic()
        # Longer than a node's grace (20 s): a node that could not reach the other host would be unreachable.
        time.sleep(30)
        runs = scenarios.task_runs(cluster)
        window = time.monotonic() - counted_from
        nodes = fleet.summary()["nodes"]
    failed = [(sent, t, s, c) for sent, t, s, c in clients.results if s != 200]
    sent = len(clients.results)
    last = max((t - killed_at for _, t, _, _ in failed), default=0.0)
    print(
        f"\nscenario 2: {sent} gateway requests ({before} before the kill), {len(failed)} failed "
        f"({sorted({s for _, _, s, _ in failed}, key=str)}, the last {last:.2f} s after the kill, the host gone "
        f"{gone_at - killed_at:.3f} s after it); "
        f"nodes after 30 s: {nodes}; task runs in {window:.0f} s: "
        f"{ {t: runs[t] - runs_before.get(t, 0) for t in runs} }"
    )
    assert before > 0 and sent > before + 10, "traffic went on through the other host"
    routed = (cluster.root / "haproxy.log").read_text()
    for backend in ("llmgw_admin", "llmgw_gateway"):
        for host in ("ctl1", "ctl2"):
            assert f"{backend}/{host} " in routed, f"HAProxy sent no {backend} request to {host}: both carry traffic"
    assert nodes["unreachable"] == 0 and nodes["ready"] >= fleet.nodes, nodes
    # Only requests sent before the killed host was gone may fail: those in flight on it.
    assert all(killed_at - 30 < sent <= gone_at for sent, _, _, _ in failed), (
        f"failed after the host was gone: {failed}"
    )
    assert all(killed_at <= t < killed_at + 10 for _, t, _, _ in failed), f"failed before or long after: {failed}"
    # One beat, on the surviving host: each periodic task ran once a period, not twice, not never.
    for task, period in scenarios.PERIODIC_CHECKED.items():
        ran = runs[task] - runs_before[task]
        assert window / period - 1.5 <= ran <= window / period + 1.5, (task, ran, window)
    assert runs["placement.tasks.reconcile"] > runs_before["placement.tasks.reconcile"], "the reconciler runs"
