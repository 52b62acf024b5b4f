"""Issue #17's failures under load, on two control hosts built from deploy/ on this machine, with a table.

One cluster (tests/deploy/multihost.py: etcd, Patroni with a leader and a
synchronous standby, a Redis of its own, HAProxy, two ``llmgw serve
--no-worker`` with a worker each and one beat), populated with ``--nodes``
simulated agents and a fake engine, then, in order:

1. steady state: gateway clients through HAProxy for ``--steady-s`` seconds;
   both hosts carry traffic, the summary lists the two database members;
4. Redis stopped for ``--redis-outage-s`` seconds (60 by default);
5. one team budget spent through both hosts by 50 requests at once;
3. a Patroni switchover (patronictl), then the new leader SIGKILLed;
2. the control host without the beat restarted with a short lease, then SIGKILLed while it holds budget
   reservations: when they are back, and each periodic task's runs (exact, recorded by the database).

Printed: one row per scenario — requests sent, failed, lost (answered but
without a usage record), seconds until it was whole again — and a line of
what else was seen. The invariants are asserted by
tests/deploy/test_multihost.py on the same scenarios (tests/deploy/scenarios.py).
Needs root (PostgreSQL runs as the postgres account) and Debian's etcd-server,
patroni, haproxy and redis-server.

    python -m bench.failover --nodes 200
"""

from __future__ import annotations

import argparse
import time

from tests.deploy import scenarios
from tests.deploy.scenarios import Clients, Figures


def steady(fleet: scenarios.Fleet, seconds: float) -> Figures:
    before = scenarios.ok_records(fleet.cluster)
    with Clients(fleet.gateway, fleet.key) as clients:
        time.sleep(seconds)
    ok = clients.ok()
    records = scenarios.settled(fleet.cluster, before + ok) - before
    summary = fleet.summary()
    store = ", ".join(f"{m['name']} {m['role']}" for m in summary["store"])
    return Figures(
        f"1. steady, {fleet.nodes} nodes",
        len(clients.results),
        len(clients.results) - ok,
        ok - records,
        None,
        f"{ok / seconds:.0f} requests/s; nodes {summary['nodes']}; store: {store}",
    )


def table(rows: list[Figures]) -> str:
    lines = [f"{'scenario':34} {'sent':>7} {'failed':>7} {'lost':>5} {'recover s':>10}"]
    for row in rows:
        recover = "-" if row.recover_s is None else f"{row.recover_s:.1f}"
        lines.append(f"{row.scenario:34} {row.sent:>7} {row.failed:>7} {row.lost:>5} {recover:>10}")
    lines.append("")
    lines += [f"{row.scenario}: {row.note}" for row in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--heartbeat", type=float, default=5.0, help="seconds between a simulated node's beats")
    parser.add_argument("--steady-s", type=float, default=20.0)
    parser.add_argument("--redis-outage-s", type=float, default=60.0)
    args = parser.parse_args()
    cluster = scenarios.build()
    rows: list[Figures] = []
    try:
        fleet = scenarios.populate(cluster, args.nodes, args.heartbeat)
        rows.append(steady(fleet, args.steady_s))
        rows.append(scenarios.redis_outage(fleet, args.redis_outage_s)[0])
        rows.append(scenarios.budgets_across_hosts(fleet)[0])
        rows.append(scenarios.database_change(fleet, "switchover")[0])
        figures, seen = scenarios.database_change(fleet, "failover")
        rows.append(figures)
        cluster.restart_patroni(seen["old"])
        rows.append(scenarios.host_killed(fleet)[0])
    finally:
        print(table(rows), flush=True)
        scenarios.discard(cluster)


if __name__ == "__main__":
    main()
