"""The admin from day one, for three people: an operator, a viewer, and a stranger.

- Olive the operator is a superuser: she edits the catalog and reads everything.
- Victor the viewer is staff with view permissions only: he reads, changes nothing.
- An anonymous visitor is sent to the login page.
"""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission, User
from django.urls import reverse

from catalog.models import Alias, CatalogModel, DeclaredIn, Profile
from inventory.models import GPU, IBPort, Node, NVLinkDomain
from placement.models import Replica, Shard

pytestmark = pytest.mark.django_db

CHANGELISTS = [
    "catalog_catalogmodel",
    "catalog_capacitymeasurement",
    "inventory_node",
    "inventory_gpu",
    "inventory_nvlinkdomain",
    "inventory_ibport",
    "inventory_subnetmanagerchange",
    "inventory_jointoken",
    "placement_replica",
    "placement_shard",
    "core_apitoken",
    "core_auditentry",
    "core_taskrun",
]


@pytest.fixture
def olive(client):
    user = User.objects.create_superuser("olive", password="x" * 12)
    client.force_login(user)
    return client


@pytest.fixture
def victor(client):
    user = User.objects.create_user("victor", password="x" * 12, is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename__startswith="view_"))
    client.force_login(user)
    return client


@pytest.fixture
def fleet():
    domain = NVLinkDomain.objects.create(cluster_uuid="1b4d-…", clique_id=7, name="rack-a")
    node = Node.objects.create(name="gb200-tray-01", hostname="tray01.example", memory_mb=884_000)
    GPU.objects.create(
        node=node,
        index=0,
        uuid="GPU-0",
        name="NVIDIA GB200",
        gpu_class="gb200-185g",
        domain=domain,
        fabric_state="Completed",
        fabric_status="Success",
    )
    GPU.objects.create(
        node=node,
        index=1001,
        parent_index=0,
        uuid="GPU-0",
        mig_uuid="MIG-1",
        name="NVIDIA GB200",
        gpu_class="gb200-185g-mig-1g.23gb",
        mig_profile="1g.23gb",
    )
    IBPort.objects.create(node=node, hca="mlx5_0", port=1, state="ACTIVE", rate_gbps=400)
    model = CatalogModel.objects.create(name="llama-70b", max_replicas=2)
    Profile.objects.create(model=model, name="nvl", engine="vllm", gpu_class="gb200-185g", gpus=4, tp=4)
    Alias.objects.create(model=model, name="llama")
    replica = Replica.objects.create(model=model, profile_name="nvl")
    Shard.objects.create(replica=replica, node=node, gpu_indices=[0, 1, 2, 3])
    return {"node": node, "model": model, "replica": replica, "domain": domain}


@pytest.mark.parametrize("changelist", CHANGELISTS)
def test_every_list_renders_for_the_operator(olive, fleet, changelist):
    assert olive.get(reverse(f"admin:{changelist}_changelist")).status_code == 200


@pytest.mark.parametrize("changelist", CHANGELISTS)
def test_every_list_sends_a_stranger_to_the_login_page(client, changelist):
    response = client.get(reverse(f"admin:{changelist}_changelist"))
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("admin:login"))


def test_detail_pages_render(olive, fleet):
    for url in [
        reverse("admin:inventory_node_change", args=[fleet["node"].pk]),
        reverse("admin:catalog_catalogmodel_change", args=[fleet["model"].pk]),
        reverse("admin:placement_replica_change", args=[fleet["replica"].pk]),
        reverse("admin:inventory_nvlinkdomain_change", args=[fleet["domain"].pk]),
        reverse("admin:catalog_catalogmodel_add"),
        reverse("admin:index"),
    ]:
        assert olive.get(url).status_code == 200, url


def test_lists_filter_and_search(olive, fleet):
    url = reverse("admin:inventory_gpu_changelist")
    page = olive.get(url, {"q": "MIG-1"}).content.decode()
    assert "0/mig1" in page
    page = olive.get(url, {"gpu_class": "gb200-185g"}).content.decode()
    assert "gb200-tray-01/0" in page and "0/mig1" not in page
    nodes = olive.get(reverse("admin:inventory_node_changelist"), {"q": "tray01"}).content.decode()
    assert "gb200-tray-01" in nodes


def test_viewer_reads_but_cannot_change(victor, fleet):
    change = reverse("admin:catalog_catalogmodel_change", args=[fleet["model"].pk])
    assert victor.get(change).status_code == 200
    assert victor.post(change, {"name": "renamed"}).status_code == 403
    assert victor.get(reverse("admin:catalog_catalogmodel_add")).status_code == 403


def test_inventory_is_written_by_agents_not_by_hand(olive):
    assert olive.get(reverse("admin:inventory_gpu_add")).status_code == 403
    assert olive.get(reverse("admin:placement_replica_add")).status_code == 403


def model_form(name="qwen-7b", **overrides):
    data = {
        "name": name,
        "description": "",
        "source": "hf://Qwen/Qwen2.5-7B-Instruct",
        "min_replicas": "1",
        "max_replicas": "2",
        "idle_timeout": "",
        "profiles-TOTAL_FORMS": "1",
        "profiles-INITIAL_FORMS": "0",
        "profiles-MIN_NUM_FORMS": "0",
        "profiles-MAX_NUM_FORMS": "1000",
        "profiles-0-name": "h100",
        "profiles-0-position": "0",
        "profiles-0-engine": "vllm",
        "profiles-0-gpu_class": "h100-80g",
        "profiles-0-memory_gb": "",
        "profiles-0-pool": "",
        "profiles-0-gpus": "2",
        "profiles-0-nodes": "1",
        "profiles-0-tp": "2",
        "profiles-0-pp": "1",
        "profiles-0-engine_args": "[]",
        "profiles-0-env": "{}",
        "aliases-TOTAL_FORMS": "0",
        "aliases-INITIAL_FORMS": "0",
        "aliases-MIN_NUM_FORMS": "0",
        "aliases-MAX_NUM_FORMS": "1000",
        "adapters-TOTAL_FORMS": "0",
        "adapters-INITIAL_FORMS": "0",
        "adapters-MIN_NUM_FORMS": "0",
        "adapters-MAX_NUM_FORMS": "1000",
        "fallbacks-TOTAL_FORMS": "0",
        "fallbacks-INITIAL_FORMS": "0",
        "fallbacks-MIN_NUM_FORMS": "0",
        "fallbacks-MAX_NUM_FORMS": "1000",
    }
    data.update(overrides)
    return data


def test_operator_adds_a_model_with_a_profile(olive):
    response = olive.post(reverse("admin:catalog_catalogmodel_add"), model_form())
    assert response.status_code == 302, response.content.decode()[:2000]
    model = CatalogModel.objects.get(name="qwen-7b")
    assert model.profiles.get().fingerprint


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        ({"min_replicas": "3", "max_replicas": "1"}, "max replicas (1) is below min replicas (3)"),
        ({"profiles-0-tp": "4"}, "tp × pp (4 × 1 = 4) must equal gpus × nodes (2 × 1 = 2)"),
        ({"profiles-0-gpu_class": "a100-80g-mig-3g.40gb"}, "a replica runs on exactly one"),
        ({"profiles-0-gpu_class": "cpu", "profiles-0-gpus": "0", "profiles-0-tp": "1"}, "needs memory_gb"),
        ({"name": "no spaces please"}, "must start with a letter or digit"),
    ],
)
def test_validation_errors_are_shown_in_an_operators_words(olive, overrides, words):
    response = olive.post(reverse("admin:catalog_catalogmodel_add"), model_form(**overrides))
    assert response.status_code == 200
    assert words in response.content.decode()
    assert not CatalogModel.objects.filter(name=overrides.get("name", "qwen-7b")).exists()


def test_an_alias_owned_by_another_model_is_refused(olive, fleet):
    data = model_form(**{"aliases-TOTAL_FORMS": "1", "aliases-0-name": "llama"})
    response = olive.post(reverse("admin:catalog_catalogmodel_add"), data)
    assert response.status_code == 200
    assert "already" in response.content.decode()


def test_models_declared_in_the_file_are_read_only(olive):
    model = CatalogModel.objects.create(name="from-file", declared_in=DeclaredIn.FILE)
    change = reverse("admin:catalog_catalogmodel_change", args=[model.pk])
    page = olive.get(change)
    assert page.status_code == 200
    assert 'name="name"' not in page.content.decode(), "no editable name field"
    assert olive.post(change, {"name": "renamed"}).status_code == 403
    model.refresh_from_db()
    assert model.name == "from-file"
