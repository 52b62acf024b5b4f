"""The reachability sweep at the scale of a fleet gone silent at once: the same decisions, in queries that do not grow.

Its readings were rewritten so that 10,000 nodes silent together cost seconds,
not a minute (bench/silence.py): here the rewritten sweep is held to the old
one (tests/inventory/reachability_reference.py) on varied fleets — NVLink
domains going dark and coming back, racks and the whole fleet partitioned,
partitions held and held past their bound, flappers cordoned, lone nodes
lost — and its queries are counted at two sizes of the same silence.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from core.models import AuditEntry, Finding
from inventory import reachability
from inventory.models import GPU, FleetEvent, IBPort, Node, NVLinkDomain
from tests.inventory import reachability_reference

pytestmark = pytest.mark.django_db

STEP_S = 5
# A hold short enough that a scenario sees partitions end as losses; a window of flaps it can fill.
RULES = reachability.LossRules(hold_s=60, flap_window_s=600)
GRACE, LOST, DOMAIN_LOST = 20.0, 60.0, 120.0


def build(domains: int, hgx: int, rack: int = 4) -> list[str]:
    """``domains`` NVLink domains of three trays (a rack each), ``hgx`` plain nodes in racks of ``rack``; names."""
    now = timezone.now()
    names = []
    for d in range(domains):
        domain = NVLinkDomain.objects.create(cluster_uuid=f"nvl-{d}", clique_id=1)
        for t in range(3):
            node = Node.objects.create(name=f"nvl{d:02d}-tray{t}", last_seen=now, labels={"rack": f"nvl{d:02d}"})
            GPU.objects.bulk_create(
                GPU(node=node, index=i, uuid=f"nvl{d}-{t}-{i}", name="GB200", gpu_class="gb200-185g", domain=domain)
                for i in range(4)
            )
            names.append(node.name)
    for i in range(hgx):
        node = Node.objects.create(name=f"hgx{i:03d}", last_seen=now, labels={"rack": f"r{i // rack}"})
        IBPort.objects.bulk_create(IBPort(node=node, hca=f"mlx5_{h}", port=1, **fabric_of_port(i, h)) for h in range(2))
        names.append(node.name)
    return names


def fabric_of_port(i: int, hca: int) -> dict:
    """Two named fabrics, the first nine plain nodes on ``north``, the rest on ``south``.

    Among them a node on both (in neither's group), one with a port down, one
    whose SM could not be read (in none), an unnamed port at another LID.
    """
    sm, name = ("0x248a0703005d1b01", "north") if i < 9 else ("0x248a0703005d2c02", "south")
    port = {"state": "4: ACTIVE", "link_layer": "InfiniBand", "sm_guid": sm, "sm_lid": 1, "fabric": name}
    if i == 2 and hca == 1:
        port.update(sm_guid="0x248a0703005d2c02", fabric="south")
    if i == 5 and hca == 1:
        port.update(state="1: DOWN")
    if i == 7:
        port.update(sm_guid="", sm_error="timeout")
    if i == 10 and hca == 0:
        port.update(fabric="", sm_lid=7)
    return port


def scripted(names: list[str], seed: int, steps: int) -> list[set[str]]:
    """Who is silent at each step: lone silences short and long, flappers, a rack or a domain, now and then all."""
    rng = random.Random(seed)
    silent: list[set[str]] = [set() for _ in range(steps)]

    def quiet(group: list[str], start: int, length: int) -> None:
        for s in range(start, min(steps, start + length)):
            silent[s] |= set(group)

    for name in names:
        for _ in range(rng.choice([0, 0, 1, 3])):
            quiet([name], rng.randrange(steps), rng.choice([2, 6, 12, 30]))
    racks: dict[str, list[str]] = {}
    for name in names:
        racks.setdefault(name.split("-")[0] if name.startswith("nvl") else f"r{int(name[3:]) // 4}", []).append(name)
    for _ in range(rng.randint(1, 4)):
        group = rng.choice(list(racks.values()))
        part = group if rng.random() < 0.5 else rng.sample(group, max(1, len(group) * 3 // 4))
        quiet(part, rng.randrange(steps), rng.choice([3, 10, 25, 60]))
    if rng.random() < 0.5:
        quiet(names, rng.randrange(steps), rng.choice([6, 30]))
    return silent


def drive(silent: list[set[str]], t0) -> list[dict]:
    """Each step: the living beat, one sweep; each sweep's result, then the rows it left."""
    results = []
    for s, quiet in enumerate(silent, start=1):
        now = t0 + timedelta(seconds=s * STEP_S)
        Node.objects.exclude(name__in=quiet).update(last_seen=now, reachable=True, lost=False, unreachable_since=None)
        r = reachability.sweep(now, GRACE, LOST, DOMAIN_LOST, rules=RULES)
        results.append({k: v for k, v in vars(r).items() if v})
    results.append(
        {
            "nodes": list(Node.objects.order_by("name").values_list("name", "reachable", "lost", "unreachable_since")),
            "states": list(Node.objects.order_by("name").values_list("name", "state")),
            "events": sorted(
                FleetEvent.objects.values_list(
                    "kind", "subject", "node__name", "domain__cluster_uuid", "started_at", "ended_at", "detail"
                ),
                key=repr,
            ),
            "findings": sorted(Finding.objects.values_list("kind", "subject", "message", "resolved_at"), key=repr),
            "audit": sorted(AuditEntry.objects.values_list("actor", "action", "target", "detail"), key=repr),
        }
    )
    return results


def run_rolled_back(fn: Callable[[], list[dict]]) -> list[dict]:
    """``fn``'s results, with everything it wrote undone so that the next run starts from the same rows."""

    class Undo(Exception):
        pass

    out: list[dict] = []
    try:
        with transaction.atomic():
            out = fn()
            raise Undo
    except Undo:
        pass
    return out


@pytest.mark.parametrize("seed", range(8))
def test_the_rewritten_sweep_decides_what_the_old_one_did(seed, monkeypatch):
    names = build(domains=3, hgx=12)
    silent = scripted(names, seed, steps=90)
    t0 = timezone.now()
    new = run_rolled_back(lambda: drive(silent, t0))
    with monkeypatch.context() as m:
        reachability_reference.install(m)
        old = run_rolled_back(lambda: drive(silent, t0))
    assert new == old
    # The scenario did something worth comparing.
    assert any(r.get("unreachable") for r in new[:-1])


def test_a_scripted_fleet_meets_every_decision_the_comparison_is_for(monkeypatch):
    """One scenario sure to hold them all: domains dark, back and lost; partitions held, ended, expired; a flapper."""
    names = build(domains=3, hgx=12)
    steps = 120
    silent: list[set[str]] = [set() for _ in range(steps)]

    def quiet(group, start, length):
        for s in range(start, min(steps, start + length)):
            silent[s] |= set(group)

    quiet([n for n in names if n.startswith("nvl00")], 2, 10)  # a domain dark, back within its patience
    quiet([n for n in names if n.startswith("nvl01")], 2, 60)  # one dark long enough to be lost
    quiet(["hgx000", "hgx001", "hgx002"], 20, 40)  # a rack partitioned, held past the bound
    quiet(["hgx004", "hgx005", "hgx006", "hgx007"], 30, 8)  # a rack partitioned, back
    quiet(["hgx010"], 5, 20)  # a lone node lost
    for start in (10, 25, 40, 55):  # a flapper
        quiet(["hgx011"], start, 6)
    quiet(names, 90, 10)  # the whole fleet, held, back
    t0 = timezone.now()
    new = run_rolled_back(lambda: drive(silent, t0))
    with monkeypatch.context() as m:
        reachability_reference.install(m)
        old = run_rolled_back(lambda: drive(silent, t0))
    assert new == old
    seen = {k for r in new[:-1] for k in r}
    assert seen >= {
        "unreachable",
        "lost",
        "domains_dark",
        "domains_back",
        "partitions",
        "partitions_over",
        "partitions_expired",
        "cordoned",
    }


def counted(domains: int) -> list[tuple[int, list[str]]]:
    """The queries of each pass of one silence of the whole fleet, at ``domains`` NVLink domains of three trays.

    Passes: the fleet falls silent (domains dark, one partition); its nodes
    would be lost by now but are held; all answer (domains back, the
    partition over); the domains' trays go dark alone, without partitions,
    and stay silent past the domains' patience (lost).
    """
    build(domains=domains, hgx=0)
    t0 = timezone.now()
    off = reachability.LossRules(share=1.0)
    passes = [(30, set(), RULES), (100, set(), RULES), (105, None, RULES), (135, set(), off), (300, set(), off)]
    counts = []
    for s, alive, rules in passes:
        now = t0 + timedelta(seconds=s)
        if alive is None:
            Node.objects.update(last_seen=now, reachable=True, lost=False, unreachable_since=None)
        with CaptureQueriesContext(connection) as seen:
            result = reachability.sweep(now, GRACE, LOST, DOMAIN_LOST, rules=rules)
        counts.append((len(seen), sorted(k for k, v in vars(result).items() if v)))
    return counts


def test_the_sweep_s_queries_do_not_grow_with_the_silence():
    small = run_rolled_back(lambda: [counted(1)])[0]
    large = run_rolled_back(lambda: [counted(10)])[0]
    assert [what for _, what in small] == [
        ["domains_dark", "partitions", "unreachable"],
        [],
        ["domains_back", "partitions_over"],
        ["domains_dark", "unreachable"],
        ["lost"],
    ]
    assert small == large
