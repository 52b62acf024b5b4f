"""Constraints the database holds by itself, whatever wrote the row."""

from __future__ import annotations

import pytest
from django.db import IntegrityError, transaction

from catalog.models import Alias, CatalogModel, Fallback, Profile
from inventory.devices import mig_index, mig_label
from inventory.models import GPU, IBPort, Node, NVLinkDomain
from placement.models import Replica, Shard

pytestmark = pytest.mark.django_db


def refused(**kw):
    return pytest.raises(IntegrityError, **kw)


@pytest.fixture
def node():
    return Node.objects.create(name="gpu-01", memory_mb=1024)


@pytest.fixture
def model():
    return CatalogModel.objects.create(name="llama-8b", min_replicas=1, max_replicas=2)


def test_node_names_are_unique(node):
    with refused(), transaction.atomic():
        Node.objects.create(name="gpu-01")


def test_node_memory_cannot_be_negative():
    with refused(), transaction.atomic():
        Node.objects.create(name="n", memory_mb=-1)


def test_node_state_must_be_known():
    with refused(), transaction.atomic():
        Node.objects.create(name="n", state="asleep")


def test_one_gpu_per_index_on_a_node(node):
    GPU.objects.create(node=node, index=0, uuid="GPU-a", name="H100", gpu_class="h100-80g")
    with refused(), transaction.atomic():
        GPU.objects.create(node=node, index=0, uuid="GPU-b", name="H100", gpu_class="h100-80g")


def test_mig_instances_are_numbered_past_the_cards(node):
    assert mig_index(3, 2) == 1302 and mig_label(1302) == "3/mig2" and mig_label(3) == "3"
    GPU.objects.create(
        node=node,
        index=mig_index(0, 1),
        parent_index=0,
        uuid="GPU-a",
        mig_uuid="MIG-x",
        name="A100",
        gpu_class="a100-80g-mig-3g.40gb",
    )
    # An instance numbered like a card, or a card numbered like an instance, is refused.
    with refused(), transaction.atomic():
        GPU.objects.create(node=node, index=5, parent_index=0, uuid="GPU-a", name="A100", gpu_class="x")
    with refused(), transaction.atomic():
        GPU.objects.create(node=node, index=1005, uuid="GPU-a", name="A100", gpu_class="x")


def test_gpu_memory_cannot_be_negative(node):
    with refused(), transaction.atomic():
        GPU.objects.create(node=node, index=0, uuid="u", name="n", gpu_class="c", memory_mb=-5)


def test_nvlink_domain_is_unique_by_cluster_and_clique():
    NVLinkDomain.objects.create(cluster_uuid="c1", clique_id=1)
    NVLinkDomain.objects.create(cluster_uuid="c1", clique_id=2)
    with refused(), transaction.atomic():
        NVLinkDomain.objects.create(cluster_uuid="c1", clique_id=1)
    with refused(), transaction.atomic():
        NVLinkDomain.objects.create(cluster_uuid="c2", clique_id=-1)


def test_ib_port_unique_per_node_and_rate_non_negative(node):
    IBPort.objects.create(node=node, hca="mlx5_0", port=1, rate_gbps=400)
    with refused(), transaction.atomic():
        IBPort.objects.create(node=node, hca="mlx5_0", port=1)
    with refused(), transaction.atomic():
        IBPort.objects.create(node=node, hca="mlx5_1", port=1, rate_gbps=-1)


def test_model_max_below_min_is_refused():
    with refused(), transaction.atomic():
        CatalogModel.objects.create(name="m", min_replicas=3, max_replicas=2)


def test_model_replica_counts_cannot_be_negative():
    with refused(), transaction.atomic():
        CatalogModel.objects.create(name="m", min_replicas=-1, max_replicas=0)


def test_aliases_are_unique_across_all_models(model):
    other = CatalogModel.objects.create(name="other")
    Alias.objects.create(model=model, name="llama")
    with refused(), transaction.atomic():
        Alias.objects.create(model=other, name="llama")


def test_fallbacks_are_ordered_unique_and_never_self(model):
    other = CatalogModel.objects.create(name="small")
    Fallback.objects.create(model=model, target=other, position=0)
    with refused(), transaction.atomic():
        Fallback.objects.create(model=model, target=other, position=1)
    with refused(), transaction.atomic():
        Fallback.objects.create(model=model, target=model, position=2)


def test_profiles_hold_their_counts(model):
    Profile.objects.create(model=model, name="a", engine="vllm", gpu_class="h100-80g", gpus=1)
    with refused(), transaction.atomic():
        Profile.objects.create(model=model, name="a", engine="vllm", gpu_class="h100-80g")
    with refused(), transaction.atomic():
        Profile.objects.create(model=model, name="b", engine="vllm", gpu_class="h100-80g", tp=0)
    with refused(), transaction.atomic():
        Profile.objects.create(model=model, name="c", engine="vllm", gpu_class="h100-80g", nodes=0)
    with refused(), transaction.atomic():
        Profile.objects.create(model=model, name="d", engine="tgi", gpu_class="h100-80g")
    with refused(), transaction.atomic():
        Profile.objects.create(model=model, name="e", engine="llamacpp", gpu_class="cpu", gpus=0, memory_gb=0)


def test_profile_fingerprint_follows_the_definition(model):
    profile = Profile.objects.create(model=model, name="a", engine="vllm", gpu_class="h100-80g", gpus=2, tp=2)
    before = profile.fingerprint
    profile.position = 5
    profile.save()
    assert profile.fingerprint == before, "moving a profile does not change how it runs"
    profile.engine_args = ["--max-model-len", "8192"]
    profile.save()
    assert profile.fingerprint != before


def test_shards_have_one_rank_each_and_non_negative_progress(model, node):
    replica = Replica.objects.create(model=model, profile_name="a")
    Shard.objects.create(replica=replica, node=node, rank=0, fetch_done=10, fetch_total=100)
    with refused(), transaction.atomic():
        Shard.objects.create(replica=replica, node=node, rank=0)
    with refused(), transaction.atomic():
        Shard.objects.create(replica=replica, node=node, rank=1, fetch_done=-1)


def test_replica_state_must_be_known(model):
    with refused(), transaction.atomic():
        Replica.objects.create(model=model, profile_name="a", state="sleeping")


def test_stale_replica_is_one_whose_profile_changed(model):
    profile = Profile.objects.create(model=model, name="a", engine="vllm", gpu_class="h100-80g")
    replica = Replica.objects.create(
        model=model, profile=profile, profile_name="a", profile_fingerprint=profile.fingerprint
    )
    assert not replica.stale
    profile.gpus, profile.tp = 2, 2
    profile.save()
    replica.refresh_from_db()
    assert replica.stale
    assert not Replica(model=model, profile=profile, profile_name="a").stale, "no fingerprint: not stale"


def test_fetch_percent_is_unknown_without_a_total(model, node):
    replica = Replica.objects.create(model=model, profile_name="a")
    shard = Shard(replica=replica, node=node, fetch_done=5)
    assert shard.fetch_percent is None
    shard.fetch_total = 10
    assert shard.fetch_percent == 50
