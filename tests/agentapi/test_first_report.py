"""A node's first report, taken at registration without reads (ingest_new_node): the same rows, fewer round trips.

Registering 10,000 nodes at once is bound by round trips to PostgreSQL: the
node's first report took 22 queries (an INSERT then an UPDATE of the node,
reads of cards, ports, health events and holds it cannot have yet, and a
savepoint around each step), now 8 (7 outside an NVLink domain), however many cards and ports it has.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from agent.simulator import fleet as F
from core.models import AuditEntry
from inventory.models import GPU, CardHealthEvent, CardHold, IBPort, Node
from inventory.writes.heartbeats import desk
from inventory.writes.ingest import ingest_new_node, ingest_report
from llmgw.bootstrap import issue_join_token
from tests.agentapi.agenthttp import register
from tests.agentapi.reports import gpu, report
from tests.agentapi.test_fast_lane import beats
from tests.agentapi.test_fast_lane import register as register_node

pytestmark = pytest.mark.django_db(transaction=True)

# The registration of a new node with its report: the join token; BEGIN; the name looked up
# (locked); the node inserted; the NVLink domain its cards joined looked up (one per domain, not
# per card; none for a node outside one); its cards and its ports inserted; COMMIT.
REGISTRATION_QUERIES = 8


def stored(name: str) -> dict:
    """Everything a report stores for the node, keyed so that two nodes' rows compare (ids left out)."""
    node = Node.objects.get(name=name)
    row = {k: v for k, v in vars(node).items() if not k.startswith("_")}
    for volatile in ("id", "name", "machine_id", "credential_digest", "registered_at"):
        row.pop(volatile)
    cards = [
        {**{k: v for k, v in vars(g).items() if k not in ("_state", "id", "node_id")}}
        for g in GPU.objects.filter(node=node).order_by("index")
    ]
    ports = [
        {k: v for k, v in vars(p).items() if k not in ("_state", "id", "node_id")}
        for p in IBPort.objects.filter(node=node).order_by("hca", "port")
    ]
    events = sorted(
        json.dumps([e.gpu_index, e.at.isoformat(), e.severity, e.what, e.xid])
        for e in CardHealthEvent.objects.filter(node=node)
    )
    holds = sorted((h.gpu_index, h.reason) for h in CardHold.objects.filter(node=node))
    audit = sorted(
        (a.action, a.target.replace(name, "NODE"), json.dumps(a.detail, sort_keys=True))
        for a in AuditEntry.objects.filter(target__startswith=name)
    )
    return {"node": row, "gpus": cards, "ports": ports, "events": events, "holds": holds, "audit": audit}


def faulted_fleet() -> list[F.SimNode]:
    """One of each kind, and faults that make a first report record events, hold cards and cordon."""
    sims = F.build_fleet("gb200-nvl72:1@gb,h100-hgx:4@north,a100-mig:1,cpu:1")
    tray, held, cordoned, old = sims[0], sims[18], sims[19], sims[20]
    F.xid(tray, 1, 79)
    F.xid(held, 3, 79)
    F.ecc(held, 5)
    now = timezone.now().timestamp()
    for i in range(4):
        F.xid(cordoned, i, 92, at=now - i)
    F.xid(old, 2, 92, at=now - 30 * 86400)  # older than the rules look back: not kept
    return [tray, held, cordoned, old, sims[21], sims[-2], sims[-1]]


def test_a_first_report_stores_what_creating_the_node_then_taking_the_report_stores():
    now = timezone.now()
    for sim in faulted_fleet():
        body = sim.report()
        with transaction.atomic():
            node = Node.objects.create(name="before", machine_id="m", last_seen=now, credential_digest="d1")
            before = ingest_report(node, body, now)
        expected = stored("before")
        Node.objects.filter(name="before").delete()
        AuditEntry.objects.all().delete()
        with transaction.atomic():
            node = Node(name="after", machine_id="m", last_seen=now, credential_digest="d2")
            after = ingest_new_node(node, body, now)
        assert stored("after") == expected, sim.name
        assert after == before, sim.name
        Node.objects.filter(name="after").delete()
        AuditEntry.objects.all().delete()


def test_the_faults_did_act_so_the_comparison_above_means_something():
    now = timezone.now()
    sims = faulted_fleet()
    for sim in sims[:4]:
        with transaction.atomic():
            ingest_new_node(Node(name=sim.name, last_seen=now), sim.report(), now)
    held = {(sims[0].name, 1), (sims[1].name, 3), (sims[1].name, 5)}  # Xid 79 on two cards; an ECC error
    assert set(CardHold.objects.values_list("node__name", "gpu_index")) == held
    assert Node.objects.get(name=sims[2].name).health_cordon
    assert not CardHealthEvent.objects.filter(node__name=sims[3].name).exists()


def with_cards(k: int) -> dict:
    port = report()["ib_ports"][0]
    return report(gpus=[gpu(i) for i in range(k)], ib_ports=[{**port, "port": i + 1} for i in range(k)])


def test_a_registration_takes_the_same_queries_however_many_cards_and_ports(client):
    join = issue_join_token()
    assert register(client, join, "first", "m-first", report=with_cards(1)).status_code == 201  # its NVLink domain
    counts = {}
    for k in (1, 4, 16):
        with CaptureQueriesContext(connection) as seen:
            answer = register(client, join, f"node-{k}", f"m-{k}", report=with_cards(k))
        assert answer.status_code == 201, answer.content
        assert GPU.objects.filter(node__name=f"node-{k}").count() == k
        assert IBPort.objects.filter(node__name=f"node-{k}").count() == k
        counts[k] = len(seen)
    assert counts == dict.fromkeys(counts, REGISTRATION_QUERIES), counts


def test_a_name_taken_at_the_same_moment_is_refused_and_nothing_is_stored(client, monkeypatch):
    join = issue_join_token()
    other = Node.objects.create(name="taken", machine_id="m-other")
    # As when the other request committed after this one looked: the lookup finds no node of that name.
    monkeypatch.setattr("agentapi.views._NODE_BY_NAME.first", lambda *_a, **_kw: None)
    answer = register(client, join, "taken", "m-mine", report=with_cards(2))
    monkeypatch.undo()
    assert answer.status_code == 409 and "same moment" in answer.json()["error"]
    assert list(Node.objects.values_list("pk", flat=True)) == [other.pk]
    assert not GPU.objects.exists() and not IBPort.objects.exists()


def test_a_flush_takes_the_same_queries_however_many_beats(client):
    desk.pending.clear()
    join = issue_join_token()
    fleet = [register_node(client, join, f"beat-{i:02d}") for i in range(30)]
    counts = {}
    for n in (1, 30):
        asyncio.run(beats(fleet[:n], {"load": {"cpu_percent": 1.0}}))
        with CaptureQueriesContext(connection) as seen:
            assert desk.flush().written == n
        counts[n] = len(seen)
    assert counts[1] == counts[30], counts


def _queries(client, join: str, sim: F.SimNode, machine_id: str | None = None, body: dict | None = None):
    with CaptureQueriesContext(connection) as seen:
        answer = register(client, join, sim.name, machine_id or f"m-{sim.name}", report=body or sim.report())
    assert answer.status_code in (200, 201), answer.content
    return len(seen), answer


def test_a_registration_takes_the_same_queries_however_many_nodes_registered_before(client):
    # One of each kind: a GB200 tray (an NVLink domain), an HGX box, a MIG box, a node with no GPUs.
    sims = F.build_fleet("gb200-nvl72:2@gb,h100-hgx:30@north,a100-mig:2,cpu:2")
    kind = {k: [s for s in sims if s.kind == k] for k in ("gb200-nvl72", "h100-hgx", "a100-mig", "cpu")}
    trays, hgx, mig, cpu = kind.values()
    assert len(hgx) == 30 and len(mig) == 2 and len(cpu) == 2 and trays
    join = issue_join_token()
    # The first tray of a rack creates its NVLink domain (three queries more); the rest find it.
    register(client, join, trays[0].name, f"m-{trays[0].name}", report=trays[0].report())  # the rack's domain
    first = {
        k: _queries(client, join, s)[0]
        for k, s in (("tray", trays[1]), ("hgx", hgx[0]), ("mig", mig[0]), ("cpu", cpu[0]))
    }
    for sim in hgx[1:-1]:
        register(client, join, sim.name, f"m-{sim.name}", report=sim.report())
    later = {
        k: _queries(client, join, s)[0]
        for k, s in (("tray", trays[17]), ("hgx", hgx[-1]), ("mig", mig[1]), ("cpu", cpu[1]))
    }
    assert later == first, (first, later)
    assert GPU.objects.filter(node__name=mig[1].name, parent_index__isnull=False).exists()  # MIG instances stored
    assert not GPU.objects.filter(node__name=cpu[1].name).exists()
    for pk, digest in Node.objects.values_list("pk", "credential_digest"):
        assert desk.digests[pk] == {digest}  # the desk knows each once, by its own credential


def test_the_same_machine_registering_again_with_a_changed_report_takes_the_same_queries_however_large_the_fleet(
    client,
):
    sims = F.build_fleet("h100-hgx:12@north")
    join = issue_join_token()
    for sim in sims:
        register(client, join, sim.name, f"m-{sim.name}", report=sim.report())
    counts = []
    for sim in (sims[0], sims[-1]):
        body = sim.report()
        body["gpus"] = body["gpus"][:-1]  # a card gone
        body["ib_ports"][0]["state"] = "DOWN"
        count, answer = _queries(client, join, sim, body=body)
        assert answer.status_code == 200
        node = Node.objects.get(name=sim.name)
        assert GPU.objects.filter(node=node).count() == len(body["gpus"])
        assert (
            IBPort.objects.get(node=node, hca=body["ib_ports"][0]["hca"], port=body["ib_ports"][0]["port"]).state
            == "DOWN"
        )
        counts.append(count)
    assert counts[0] == counts[1], counts


def test_a_registration_refused_half_way_through_its_report_stores_nothing_and_keeps_the_credential(client):
    sim = F.build_fleet("h100-hgx:1@north")[0]
    join = issue_join_token()
    first = register(client, join, sim.name, f"m-{sim.name}", report=sim.report())
    assert first.status_code == 201
    before = stored(sim.name)
    digest = Node.objects.get(name=sim.name).credential_digest
    body = sim.report()
    body["gpus"] = body["gpus"][:2]  # a change that would be written...
    body["ib_ports"][-1]["port"] = -1  # ...but the last port is refused
    answer = register(client, join, sim.name, f"m-{sim.name}", report=body)
    assert answer.status_code == 400 and "ib_ports[" in answer.json()["error"]
    assert stored(sim.name) == before
    assert Node.objects.get(name=sim.name).credential_digest == digest
