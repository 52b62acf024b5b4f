"""placement.assignments reads plain rows: each node's shards are what the model instances gave, field for field."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from catalog.models import Adapter
from inventory.models import Node
from placement import assignments
from placement.models import Replica, ReplicaState, Shard
from tests.api.fleet import add_model, ingest_fleet, place

pytestmark = pytest.mark.django_db


def by_instances(node_ids: list[int] | None = None) -> dict[int, list[dict]]:
    """The table as the ORM's instances describe it: how for_nodes read it before it read rows."""
    shards = Shard.objects.exclude(replica__state=ReplicaState.STOPPING)
    if node_ids is not None:
        shards = shards.filter(node_id__in=node_ids)
    table: dict[int, list[dict]] = {}
    rows = shards.select_related("replica__model", "replica__profile").prefetch_related("replica__model__adapters")
    for shard in rows.order_by("replica_id", "rank"):
        replica, profile = shard.replica, shard.replica.profile
        table.setdefault(shard.node_id, []).append(
            {
                "id": f"{replica.id}-{shard.rank}",
                "replica": replica.id,
                "model": replica.model.name,
                "source": replica.model.source,
                "rank": shard.rank,
                "gpus": shard.gpu_indices,
                "env": shard.env,
                "engine": profile.engine if profile else None,
                "engine_args": profile.engine_args if profile else [],
                "tp": profile.tp if profile else 1,
                "pp": profile.pp if profile else 1,
                "nodes": profile.nodes if profile else 1,
                "api_key": replica.engine_key,
                "adapters": [{"name": a.name, "source": a.source} for a in replica.model.adapters.all()],
            }
        )
    return table


@pytest.fixture
def placed():
    return placed_fleet()


def placed_fleet():
    """Two models on three nodes (adapters, an env, a replica over two nodes); a stopping replica; a profile gone."""
    ingest_fleet("h100-hgx:3@north")
    llama = add_model()
    other = add_model(
        {
            "name": "qwen-7b",
            "source": "hf://Qwen/Qwen2.5-7B-Instruct",
            "scaling": {"min": 1, "max": 4},
            "profiles": [
                {"name": "h100", "engine": "sglang", "gpu_class": "h100-80g", "gpus": 2, "tp": 2},
            ],
        }
    )
    # Adapters made out of their names' order: the answer lists them by name.
    Adapter.objects.create(model=llama, name="llama-sql", source="hf://acme/llama-sql-lora")
    Adapter.objects.create(model=llama, name="llama-chat", source="hf://acme/llama-chat-lora")
    place(llama, "hgx-000", [0])
    with_env = place(llama, "hgx-000", [1])
    Shard.objects.filter(replica=with_env).update(env={"VLLM_LOGGING_LEVEL": "DEBUG"})
    place(other, "hgx-001", [0, 1])
    two = place(other, "hgx-001", [2, 3])
    Shard.objects.create(replica=two, node=Node.objects.get(name="hgx-002"), rank=1, gpu_indices=[2, 3], state="ready")
    place(llama, "hgx-002", [4], state=ReplicaState.STOPPING)  # left out: how its agent learns to stop it
    phi = add_model(
        {
            "name": "phi-4",
            "source": "hf://microsoft/phi-4",
            "scaling": {"min": 1, "max": 1},
            "profiles": [{"name": "h100", "engine": "vllm", "gpu_class": "h100-80g", "gpus": 2, "tp": 2}],
        }
    )
    place(phi, "hgx-002", [6, 7])
    phi.profiles.all().delete()  # its profile removed since it was placed: engine None
    return llama, other


def test_every_node_s_shards_are_what_the_instances_gave(placed):
    table = assignments.for_nodes()
    assert table == by_instances()
    assert len(table) == 3 and {len(shards) for shards in table.values()} == {2}
    llama_shard = table[Node.objects.get(name="hgx-000").pk][0]
    assert [a["name"] for a in llama_shard["adapters"]] == ["llama-chat", "llama-sql"]
    orphaned = [s for s in table[Node.objects.get(name="hgx-002").pk] if s["engine"] is None]
    assert len(orphaned) == 1 and orphaned[0]["engine_args"] == [] and orphaned[0]["tp"] == 1
    assert {s["tp"] for s in table[Node.objects.get(name="hgx-001").pk]} == {2}


def test_some_nodes_shards_are_what_the_instances_gave(placed):
    ids = list(Node.objects.filter(name__in=["hgx-001", "hgx-002"]).values_list("pk", flat=True))
    assert assignments.for_nodes(ids) == by_instances(ids)
    assert assignments.for_node(ids[0]) == by_instances([ids[0]])[ids[0]]
    assert assignments.for_nodes([]) == {}


def test_the_table_takes_two_queries_however_many_replicas(placed):
    llama, _ = placed
    with CaptureQueriesContext(connection) as few:
        assignments.for_nodes()
    for gpu in range(2, 8):
        place(llama, "hgx-000", [gpu])
    with CaptureQueriesContext(connection) as more:
        table = assignments.for_nodes()
    assert len(few) == len(more) == 2
    assert len(table[Node.objects.get(name="hgx-000").pk]) == 8
    assert Replica.objects.count() > 10
