"""For any payload node A sends on any agent endpoint, no row of node B changes, and the answer is never a 5xx.

The payloads are real reports (the simulator's, built from hardware captures,
and the hand-built one of reports.py) with a few leaves mutated — long, NUL,
huge, negative, wrong type, empty — or swapped for node B's own identifiers
(its name, hostname, GPU UUIDs, adapters, replica, fabric); heartbeats that
claim B's shards and rank 0's endpoint; scans for B's fabric. Reports,
registrations and scans are sent both through Django's test client (the
views) and through the ASGI application (the report's fast lane); heartbeats
through the ASGI application, their one path. The heartbeat desk is flushed
after each, since the flush is where queued beats are written.

Node B is the rank 0 of a replica that A holds rank 1 of, has a ready
endpoint, and is assigned its fabric's topology scan.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
from typing import Any

import httpx
import pytest
from django.test import Client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from catalog.models import WeightCollection
from inventory.models import GPU, FabricScan, IBPort, Node, SubnetManagerChange
from inventory.writes import scans
from inventory.writes.heartbeats import desk
from llmgw.asgi import application
from llmgw.bootstrap import issue_join_token
from placement.models import Replica, Shard
from placement.writes.reconciler import reconcile
from tests.agentapi.reports import report as hand_built
from tests.placement.dbfleet import credential, fleet, gpu_profile, heartbeat, live, model, shard_entry

pytestmark = pytest.mark.django_db(transaction=True)

EXAMPLES = settings(
    max_examples=35, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)


class World:
    """Node A (the sender), node B (whose rows must not move), and what B holds."""

    def __init__(self) -> None:
        sims = fleet("h100-hgx:2@north")
        model("wide", gpu_profile("h100-80g", gpus=8, nodes=2))
        reconcile()
        (self.replica,) = live("wide")
        ranks = {s.rank: s.node for s in Shard.objects.filter(replica=self.replica).select_related("node")}
        self.b, self.a = ranks[0], ranks[1]
        self.sim_a = sims[self.a.name]
        heartbeat(self.a.name, [shard_entry(self.replica, "ready", 1)])
        heartbeat(self.b.name, [shard_entry(self.replica, "ready", 0, endpoint="http://127.0.0.1:8000")])
        assert Replica.objects.get(id=self.replica.id).endpoint == "http://127.0.0.1:8000"
        scans.plan_scans(self.b.last_seen)
        FabricScan.objects.update(node=self.b)  # B's to answer, whichever node the plan chose
        WeightCollection.objects.create(node=self.b.name, path="/models/old", requested_by="olive")
        self.join = issue_join_token()
        self.a_credential = credential(self.a.name)
        self.b_gpus = list(GPU.objects.filter(node=self.b).values_list("uuid", flat=True))
        self.b_port = IBPort.objects.filter(node=self.b).values("hca", "port", "node_guid", "sm_guid").first()
        self.fabric = FabricScan.objects.values_list("fabric_key", flat=True).first()
        desk.pending.clear()
        desk.refresh_shards()

    def b_rows(self) -> dict[str, Any]:
        b = self.b.pk
        return {
            "node": list(Node.objects.filter(pk=b).values()),
            "gpus": list(GPU.objects.filter(node=b).order_by("index").values()),
            "ports": list(IBPort.objects.filter(node=b).order_by("hca", "port").values()),
            "sm": list(SubnetManagerChange.objects.filter(node=b).order_by("pk").values()),
            "shards": list(Shard.objects.filter(node=b).order_by("pk").values()),
            "endpoints": list(Replica.objects.filter(shards__node=b).order_by("id").values_list("id", "endpoint")),
            "scans": list(FabricScan.objects.order_by("fabric_key").values()),
            "collections": list(WeightCollection.objects.filter(node=self.b.name).values()),
        }

    def b_words(self) -> list[Any]:
        """B's identifiers, which a hostile A would put in its own payloads."""
        port = self.b_port or {}
        return [
            self.b.name,
            self.b.hostname,
            *self.b_gpus[:2],
            *port.values(),
            self.replica.id,
            f"{self.replica.id}-0",
            self.fabric,
            "http://127.0.0.1:6666",
            "/models/old",
        ]


@pytest.fixture
def world() -> World:
    return World()


HOSTILE_SCALARS = st.one_of(
    st.text(max_size=80),
    st.sampled_from(["", "\x00", "a\x00b", "\ud800", "x" * 5000, "0" * 300]),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([-1, 0, 2**15, 2**31, 2**63, 70000]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.none(),
)
HOSTILE = st.recursive(
    HOSTILE_SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6,
)


def leaves(value: Any, path: tuple = ()) -> list[tuple]:
    """Every path into ``value`` (dict keys and list indexes), containers included."""
    out = [path]
    if isinstance(value, dict):
        for key, child in value.items():
            out += leaves(child, (*path, key))
    elif isinstance(value, list):
        for i, child in enumerate(value):
            out += leaves(child, (*path, i))
    return out


def put(doc: Any, path: tuple, value: Any) -> Any:
    if not path:
        return value
    parent = doc
    for step in path[:-1]:
        parent = parent[step]
    parent[path[-1]] = value
    return doc


@st.composite
def mutated(draw, base: dict, words: list[Any]) -> Any:
    doc = copy.deepcopy(base)
    paths = leaves(doc)
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        path = draw(st.sampled_from(paths))
        value = draw(st.one_of(HOSTILE, st.sampled_from(words)))
        with contextlib.suppress(KeyError, IndexError, TypeError):  # an earlier mutation replaced a parent
            doc = put(doc, path, value)
    return doc


def send(lane: str, path: str, token: str, body: Any) -> httpx.Response | Any:
    raw = json.dumps(body).encode()  # NaN and Infinity included, as a buggy agent would write them
    if lane == "view":
        return Client().post(
            f"/api/v1/agent/{path}", data=raw, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}"
        )

    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=application)
        async with httpx.AsyncClient(transport=transport, base_url="http://control") as http:
            return await http.post(
                f"/api/v1/agent/{path}",
                content=raw,
                headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
            )

    return asyncio.run(go())


def check(world: World, lane: str, path: str, token: str, body: Any) -> None:
    before = world.b_rows()
    answer = send(lane, path, token, body)
    assert answer.status_code < 500, (answer.status_code, answer.content[:300])
    desk.flush()
    desk.refresh_shards()
    assert world.b_rows() == before, f"{path} from node A changed node B's rows"
    if path == "register" and answer.status_code in (200, 201) and answer.json().get("node") == world.a.name:
        world.a_credential = answer.json()["credential"]  # A registered again: its old credential is revoked


LANES = st.sampled_from(["view", "fast"])


@EXAMPLES
@given(data=st.data())
def test_no_report_from_node_a_changes_node_bs_rows(world, data):
    base = data.draw(st.sampled_from([world.sim_a.report(), hand_built(hostname=world.a.name)]))
    body = data.draw(mutated(base, world.b_words()))
    check(world, data.draw(LANES), "report", world.a_credential, body)


@EXAMPLES
@given(data=st.data())
def test_no_registration_changes_node_bs_rows(world, data):
    base = {"name": world.a.name, "machine_id": world.a.machine_id, "report": world.sim_a.report()}
    body = data.draw(mutated(base, world.b_words()))
    check(world, data.draw(LANES), "register", world.join, body)


@st.composite
def shard_claim(draw, world: World, replica: str, rank: int) -> dict:
    """A shard entry as A might send it, about ``replica``'s ``rank``."""
    words = world.b_words()
    entry = {
        "id": f"{replica}-{rank}",
        "replica": replica,
        "rank": rank,
        "state": draw(st.sampled_from(["ready", "ready", "ready", "failed", "fetching", "stopped", None, ["ready"]])),
        "endpoint": draw(st.sampled_from(["http://127.0.0.1:6666", "http://169.254.169.254:80", "", None, 5])),
        "fetch": {"bytes_done": draw(st.integers(0, 10**6) | HOSTILE_SCALARS), "bytes_total": draw(HOSTILE_SCALARS)},
        "error": draw(HOSTILE_SCALARS),
    }
    return draw(st.one_of(st.just(entry), st.just(entry), mutated(entry, words)))


@st.composite
def shard_claims(draw, world: World) -> list[dict]:
    """A's own shard (rank 1 of the replica it shares with B) beside a claim on rank 0, B's, in any order.

    A's own entry is what lets the replica be looked at again; the claim beside
    it is what used to set rank 0's endpoint.
    """
    r = world.replica.id
    claims = [draw(shard_claim(world, r, 1)), draw(shard_claim(world, r, 0))]
    claims += draw(st.lists(shard_claim(world, draw(st.sampled_from([r, *map(str, world.b_words())])), 0), max_size=1))
    return draw(st.permutations(claims))


@settings(EXAMPLES, max_examples=60)
@given(data=st.data())
def test_no_heartbeat_from_node_a_changes_node_bs_rows(world, data):
    beat = {
        "load": {"cpu_percent": 3.0},
        "shards": data.draw(shard_claims(world)),
        "collected": [{"path": "/models/old"}],
        "report_digest": "x",
    }
    body = data.draw(st.one_of(st.just(beat), mutated(beat, world.b_words())))
    check(world, "fast", "heartbeat", world.a_credential, body)


@EXAMPLES
@given(data=st.data())
def test_no_scan_from_node_a_changes_node_bs_rows(world, data):
    from agent.simulator import fleet as F

    base = {"fabric": world.fabric, "hca": "mlx5_0", "port": 1, "output": F.scan_capture()[:4000], "took_ms": 5}
    body = data.draw(mutated(base, world.b_words()))
    check(world, data.draw(LANES), "scan", world.a_credential, body)
