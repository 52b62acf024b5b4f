"""A simulated fleet written straight into the database, for the API's tests and the bench.

Nodes come from the simulator's captures and go in through the real
ingestion (``ingest_report``), so the rows are what a live fleet's agents
would have produced — without an HTTP round trip per node.
"""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from agent.simulator import fleet as F
from catalog import writes as service
from inventory.models import Node
from inventory.writes.ingest import ingest_report
from placement.models import Replica, Shard

MODEL = {
    "name": "llama-8b",
    "source": "hf://meta-llama/Llama-3.1-8B-Instruct",
    "aliases": ["llama"],
    "scaling": {"min": 1, "max": 2},
    "profiles": [{"name": "h100", "engine": "vllm", "gpu_class": "h100-80g", "gpus": 1}],
}


def ingest_fleet(spec: str, now=None, prefix: str = "") -> list[F.SimNode]:
    """Register every node of SPEC and store its full report, as its first heartbeat would."""
    now = now or timezone.now()
    sims = F.build_fleet(spec, prefix)
    for sim in sims:
        node = Node.objects.create(name=sim.name)
        ingest_report(node, sim.report(), now)
    return sims


def ingest(sim: F.SimNode, now=None) -> None:
    """Store a node's report again, after a fault changed it."""
    ingest_report(Node.objects.get(name=sim.name), sim.report(), now or timezone.now())


def add_model(definition: dict | None = None, actor: str = "test"):
    return service.add_model(definition or MODEL, actor=actor)


def place(model, node: str, gpus: list[int], *, state: str = "ready", shard_state: str = "ready", **fields) -> Replica:
    """A replica of ``model`` with one shard on ``node``, as the reconciler would have written it."""
    profile = model.profiles.first()
    replica = Replica.objects.create(
        model=model,
        profile=profile,
        profile_name=profile.name,
        profile_fingerprint=profile.fingerprint,
        state=state,
        **fields,
    )
    Shard.objects.create(replica=replica, node=Node.objects.get(name=node), rank=0, gpu_indices=gpus, state=shard_state)
    return replica


def used_long_ago(replica: Replica, minutes: int) -> None:
    Replica.objects.filter(pk=replica.pk).update(last_used_at=timezone.now() - timedelta(minutes=minutes))
