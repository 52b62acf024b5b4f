"""LoRA adapters between the control plane and the agents: handed out with each shard, reported back loaded.

The heartbeat answer gives every shard its base model's adapters; what rank
0's agent says its engine has loaded becomes the replica's ``adapters``,
which the gateway prefers. Only rank 0's own node says it, and only names
are kept.
"""

from __future__ import annotations

import pytest

from placement.models import Replica, Shard
from placement.writes.reconciler import reconcile
from tests.placement.dbfleet import fleet, gpu_profile, heartbeat, live, model, shard_entry

pytestmark = pytest.mark.django_db

OWN = "http://127.0.0.1:8000"
SQL = {"name": "llama-sql", "source": "hf://acme/llama-sql-lora"}


@pytest.fixture
def wide():
    fleet("h100-hgx:3@north")
    model("llama", gpu_profile("h100-80g", gpus=8, nodes=2), adapters=[SQL])
    reconcile()
    (r,) = live("llama")
    first, second = Shard.objects.filter(replica=r).select_related("node").order_by("rank")
    return r, first.node.name, second.node.name


def test_each_shard_is_handed_its_models_adapters_and_rank_zero_says_what_is_loaded(wide):
    r, rank0, rank1 = wide
    answer = heartbeat(rank0, [shard_entry(r, "ready", 0, endpoint=OWN, adapters=["llama-sql"])])
    assert [s["adapters"] for s in answer["shards"]] == [[SQL]]
    # Rank 1's node naming adapters for rank 0 changes nothing; nor does its own shard's word.
    heartbeat(rank1, [shard_entry(r, "ready", 1, adapters=["forged"]), shard_entry(r, "ready", 0, adapters=["x"])])
    assert Replica.objects.get(id=r.id).adapters == ["llama-sql"]
    heartbeat(rank0, [shard_entry(r, "ready", 0, endpoint=OWN, adapters=[])])
    assert Replica.objects.get(id=r.id).adapters == []


def test_only_short_printable_names_are_kept(wide):
    r, rank0, _ = wide
    odd = ["b", "a", "b", 7, None, "", "x" * 500, "tab\there", {"name": "z"}]
    heartbeat(rank0, [shard_entry(r, "ready", 0, endpoint=OWN, adapters=odd)])
    assert Replica.objects.get(id=r.id).adapters == ["a", "b"]
    heartbeat(rank0, [shard_entry(r, "ready", 0, endpoint=OWN, adapters="not a list")])
    assert Replica.objects.get(id=r.id).adapters == ["a", "b"], "an entry that does not say changes nothing"
