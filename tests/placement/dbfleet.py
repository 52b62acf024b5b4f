"""A fleet in the database for the reconciler's tests: simulated machines registered through real ingestion.

The machines are the simulator's (built from real captures), their reports go
through ``inventory.writes.ingest`` as a heartbeat's would, and models go in through
``catalog.writes``: the reconciler is tested against the rows it meets in
production, not rows shaped by hand.
"""

from __future__ import annotations

from datetime import datetime

from django.utils import timezone

from agent.simulator import fleet as F
from catalog import writes as service
from core.credentials import hash_token
from inventory.models import Node
from inventory.writes import ingest
from placement.models import Replica, ReplicaState, Shard
from tests.agentapi import agenthttp


def register(sim: F.SimNode, now: datetime | None = None) -> Node:
    now = now or timezone.now()
    node = Node.objects.create(
        name=sim.name, machine_id=sim.name, last_seen=now, credential_digest=hash_token(credential(sim.name))
    )
    ingest.ingest_report(node, sim.report(), now)
    return node


def credential(name: str) -> str:
    return f"llmgw_node_test_{name}"


def fleet(spec: str) -> dict[str, F.SimNode]:
    nodes = {n.name: n for n in F.build_fleet(spec)}
    for sim in nodes.values():
        register(sim)
    return nodes


def rereport(sim: F.SimNode) -> None:
    """The node sends a full report after a fault changed it."""
    ingest.ingest_report(Node.objects.get(name=sim.name), sim.report(), timezone.now())


def model(name: str, *profiles: dict, min_replicas: int = 1, max_replicas: int | None = None, **extra) -> None:
    scaling = {"min": min_replicas, "max": max(min_replicas, 1) if max_replicas is None else max_replicas}
    if "idle_timeout" in extra:
        scaling["idle_timeout"] = extra.pop("idle_timeout")
    service.add_model({"name": name, "scaling": scaling, "profiles": list(profiles), **extra}, actor="test")


def gpu_profile(gpu_class: str, gpus: int = 1, nodes: int = 1, name: str = "gpu", **extra) -> dict:
    return {
        "name": name,
        "engine": "vllm",
        "gpu_class": gpu_class,
        "gpus": gpus,
        "nodes": nodes,
        "tp": gpus * nodes,
        "pp": 1,
        **extra,
    }


def replicas(model_name: str, *states: str) -> list[Replica]:
    query = Replica.objects.filter(model__name=model_name).order_by("created_at", "id")
    if states:
        query = query.filter(state__in=states)
    return list(query)


def live(model_name: str) -> list[Replica]:
    return replicas(model_name, ReplicaState.PENDING, ReplicaState.STARTING, ReplicaState.READY)


def nodes_of(replica: Replica) -> list[str]:
    return [s.node.name for s in Shard.objects.filter(replica=replica).select_related("node").order_by("rank")]


def heartbeat(node_name: str, shards: list[dict]) -> dict:
    """The node's agent sends a heartbeat with these shard states, through the real endpoint; then it is flushed."""
    answer = agenthttp.heartbeat(credential(node_name), {"shards": shards})
    assert answer.status_code == 200, answer.content
    return answer.json()


def shard_entry(replica: Replica, state: str, rank: int = 0, **extra) -> dict:
    return {"id": f"{replica.id}-{rank}", "replica": replica.id, "rank": rank, "state": state, **extra}


def report_ready(replica: Replica) -> None:
    """Every node of the replica says its shard is ready (rank 0 with an endpoint)."""
    for s in Shard.objects.filter(replica=replica).select_related("node"):
        extra = {"endpoint": "http://127.0.0.1:8000"} if s.rank == 0 else {}  # the simulated nodes' address
        heartbeat(s.node.name, [shard_entry(replica, "ready", s.rank, **extra)])
