"""The replica list read from values() rows gives exactly what reading Replica instances gave.

``replica_list`` reads each replica as a values() row (its model's name and
source, its profile's fingerprint and its domain's key joined in), decodes
each distinct JSON value of the shards once, and reads what the agents
reported only when a shard shows a download. The reference below is the
reading it replaced (a Replica with its model, profile and domain per row,
every listed node's report read), kept here word for word so the two can be
compared on a fleet with a bit of everything.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from django.db.models import JSONField, Value
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from catalog.models import Profile
from catalog.prefetch import holders_of as weight_holders_of
from inventory.devices import mig_label
from inventory.models import Node, NVLinkDomain
from placement import reads, starts
from placement.models import ColdStart, Replica, ReplicaState, Shard
from tests.api.fleet import add_model, ingest_fleet, place

pytestmark = pytest.mark.django_db

JSON_NULL = Value(None, JSONField())

# --- the reading that was replaced ------------------------------------------------

_LISTED_RELATED = (
    "model__name",
    "model__source",
    "profile__fingerprint",
    "nvlink_domain__cluster_uuid",
    "nvlink_domain__clique_id",
)


def reference_list(model: str | None, now: datetime) -> list[dict[str, Any]]:
    replicas = (
        Replica.objects.select_related("model", "profile", "nvlink_domain")
        .only(*(f.name for f in Replica._meta.concrete_fields), *_LISTED_RELATED)
        .order_by("model__name", "created_at")
    )
    if model:
        replicas = replicas.filter(model__name=model)
    replicas = list(replicas)
    shards: dict[str, list[dict]] = defaultdict(list)
    rows = Shard.objects.filter(replica__in=[r.pk for r in replicas]) if model else Shard.objects.all()
    for s in rows.values(
        "replica_id",
        "node_id",
        "node__name",
        "rank",
        "gpu_indices",
        "state",
        "error",
        "fetch_source",
        "fetch_done",
        "fetch_total",
        "phases",
    ):
        shards[s["replica_id"]].append(s)
    reported = reference_reported({s["node_id"] for group in shards.values() for s in group})
    starts = reference_starts(replicas)
    views = [reference_view(r, shards.get(r.pk, []), reported, now) for r in replicas]
    for view in views:
        if view["id"] in starts:
            view["start"] = starts[view["id"]]
    return views


def reference_reported(node_ids: set[int]) -> dict[str, dict]:
    out = {}
    for status in Node.objects.filter(pk__in=node_ids).values_list("shard_status", flat=True):
        for s in status or []:
            if isinstance(s, dict) and isinstance(s.get("id"), str) and isinstance(s.get("fetch"), dict):
                out[s["id"]] = s["fetch"]
    return out


def reference_view(r: Replica, shards: list[dict], reported: dict[str, dict], now: datetime) -> dict[str, Any]:
    view: dict[str, Any] = {
        "id": r.pk,
        "model": r.model.name,
        "profile": r.profile_name,
        "stale": r.stale,
        "state": r.state,
        "age_seconds": max(0, int((now - r.created_at).total_seconds())),
        "idle_seconds": -1 if r.last_used_at is None else max(0, int((now - r.last_used_at).total_seconds())),
        "gpus": sum(len(s["gpu_indices"] or []) for s in shards),
        "shards": [reference_shard(r.pk, s, reported) for s in sorted(shards, key=lambda s: s["rank"])],
    }
    for key, value in (
        ("pool", r.pool),
        ("fabric", r.fabric),
        ("nvlink_domain", r.nvlink_domain.key if r.nvlink_domain else ""),
        ("endpoint", r.endpoint),
        ("error", r.error),
        ("replaces", r.replaces_id or ""),
    ):
        if value:
            view[key] = value
    return view


def reference_shard(replica_id: str, s: dict, reported: dict[str, dict]) -> dict[str, Any]:
    sid = f"{replica_id}-{s['rank']}"
    view: dict[str, Any] = {
        "id": sid,
        "node": s["node__name"],
        "rank": s["rank"],
        "gpus": [i for i in s["gpu_indices"] or [] if isinstance(i, int)],
        "gpu_labels": [mig_label(i) for i in s["gpu_indices"] or [] if isinstance(i, int)],
        "state": s["state"],
    }
    if s["error"]:
        view["error"] = s["error"]
    fetch = reads.fetch_view(s, reported.get(sid))
    if fetch is not None:
        view["fetch"] = fetch
    if s.get("phases"):
        view["phases"] = s["phases"]
    return view


def reference_starts(replicas: list[Replica]) -> dict[str, dict[str, Any]]:
    starting = [r for r in replicas if r.state in (ReplicaState.PENDING, ReplicaState.STARTING)]
    if not starting:
        return {}
    rank0 = {
        s.replica_id: s
        for s in Shard.objects.filter(replica__in=[r.pk for r in starting], rank=0).select_related("node")
    }
    samples = starts._samples_of({r.model_id for r in starting})
    held = weight_holders_of({r.model_id: r.model for r in starting}.values())
    return {
        r.pk: starts.start_view(
            r.model, r, rank0.get(r.pk), samples.get((r.model_id, r.profile_name), []), held[r.model_id]
        )
        for r in starting
    }


# --- a fleet with a bit of everything -------------------------------------------------

TINY = {
    "name": "tiny",
    "profiles": [{"name": "cpu", "engine": "llamacpp", "gpu_class": "cpu", "memory_gb": 1, "gpus": 0}],
}


def shard(replica: Replica, node: str, rank: int, gpus, state: str = "ready", **fields) -> Shard:
    return Shard.objects.create(
        replica=replica, node=Node.objects.get(name=node), rank=rank, gpu_indices=gpus, state=state, **fields
    )


def varied_fleet(now: datetime) -> dict[str, Replica]:
    """Replicas of two models in every state, stale and not, with and without profile, domain, pool and downloads."""
    ingest_fleet("h100-hgx:3@north,gb200-nvl72:1,cpu:1")
    llama, tiny = add_model(), add_model(TINY)
    domain = NVLinkDomain.objects.first()
    assert domain is not None, "the rack made an NVLink domain"
    out = {
        "ready": place(llama, "hgx-000", [0, 1], pool="gold", fabric="north", endpoint="http://10.0.0.1:8000"),
        "used": place(llama, "hgx-000", [2], last_used_at=now - timedelta(minutes=12, seconds=30)),
        "failed": place(llama, "hgx-001", [0], state="failed", shard_state="failed", error="engine exited 1"),
        "fetching": place(llama, "hgx-001", [1], state="starting", shard_state="fetching"),
        "unknown size": place(llama, "hgx-002", [0], state="starting", shard_state="fetching"),
        "pending": place(llama, "hgx-002", [1], state="pending", shard_state="pending"),
        "cpu": place(tiny, "cpu-00", []),
        "cpu starting": place(tiny, "cpu-00", [], state="starting", shard_state="starting"),
    }
    Shard.objects.filter(replica=out["fetching"]).update(fetch_source="hf://x/y", fetch_done=250, fetch_total=1000)
    Shard.objects.filter(replica=out["unknown size"]).update(fetch_source="https://x/y.gguf", fetch_done=42)
    Shard.objects.filter(replica=out["pending"]).update(fetch_done=0, fetch_total=None)
    # The agent's fresher word on one download, a report of a shard that is ready, and junk beside them.
    Node.objects.filter(name="hgx-002").update(
        shard_status=[
            {"id": f"{out['unknown size'].pk}-0", "fetch": {"source": "hf://a/b", "bytes_done": 5, "bytes_total": 10}},
            {"id": f"{out['ready'].pk}-0", "fetch": {"bytes_done": 1}},
            "junk",
            {"id": 7, "fetch": {}},
        ]
    )
    Node.objects.filter(name="hgx-001").update(shard_status=JSON_NULL)
    # A multi-node replica across the rack's trays, ranks written out of order, in the domain; and its
    # ranks' odd GPU indices, one shard with JSON null for them, phases on one.
    trays = list(Node.objects.filter(name__startswith="nvl72").order_by("name").values_list("name", flat=True))
    big = place(llama, trays[2], [0, 1, 2, 3], nvlink_domain=domain, fabric="nvl")
    Shard.objects.filter(replica=big).update(rank=2, phases={"fetch_s": 1.5, "load_s": 20.25, "weights_local": True})
    shard(big, trays[0], 0, [0, 1, "x", None, 2.5, 3])
    shard(big, trays[1], 1, [0, 1, 2, 3], phases={"fetch_s": 1.5, "load_s": 20.25, "weights_local": True})
    Shard.objects.filter(replica=big, rank=0).update(gpu_indices=JSON_NULL)
    shard(big, trays[3], 3, [0, 1, 2, 3], state="failed", error="XID 79")
    out["big"] = big
    # A replacement, a stale one (its profile edited), one without a fingerprint, one whose profile is gone.
    out["replacing"] = place(llama, "hgx-000", [3], state="starting", shard_state="starting", replaces=out["ready"])
    out["no fingerprint"] = place(llama, "hgx-000", [4])
    Replica.objects.filter(pk=out["no fingerprint"].pk).update(profile_fingerprint="")
    out["no profile"] = place(tiny, "cpu-00", [])
    Replica.objects.filter(pk=out["no profile"].pk).update(profile=None)
    out["stale"] = place(tiny, "cpu-00", [])
    Profile.objects.filter(model=tiny).update(fingerprint="edited")
    # A replica with no shard yet, and measured starts for the estimates of the starting ones.
    out["unplaced"] = Replica.objects.create(model=llama, profile_name="h100", state="pending")
    for i in range(3):
        ColdStart.objects.create(
            model=llama,
            profile_name="h100",
            node="hgx-001",
            replica_id=f"r{i}",
            fetch_s=10 + i,
            load_s=30,
            weights_local=False,
        )
    # Distinct creation times a second apart, so the order by (model, created_at) has no ties.
    for i, r in enumerate(Replica.objects.order_by("pk")):
        Replica.objects.filter(pk=r.pk).update(created_at=now - timedelta(hours=1, seconds=i * 1.25))
    return out


def test_the_rows_give_the_list_the_instances_gave():
    now = timezone.now()
    made = varied_fleet(now)
    want = reference_list(None, now)
    assert reads.replica_list(now=now) == want
    for model in ("llama-8b", "tiny"):
        assert reads.replica_list(model, now=now) == reference_list(model, now)
    # The fleet did tell the stories it was built for.
    by = {v["id"]: v for v in want}
    assert by[made["stale"].pk]["stale"] and not by[made["no profile"].pk]["stale"]
    assert not by[made["no fingerprint"].pk]["stale"] and not by[made["ready"].pk]["stale"]
    assert by[made["big"].pk]["nvlink_domain"] and [s["rank"] for s in by[made["big"].pk]["shards"]] == [0, 1, 2, 3]
    assert by[made["big"].pk]["shards"][2]["phases"]["load_s"] == 20.25
    assert by[made["unknown size"].pk]["shards"][0]["fetch"]["percent"] == 50, "the agent's word"
    assert by[made["fetching"].pk]["shards"][0]["fetch"]["percent"] == 25
    assert by[made["replacing"].pk]["replaces"] == made["ready"].pk
    assert by[made["used"].pk]["idle_seconds"] == 750 and by[made["ready"].pk]["idle_seconds"] == -1
    assert by[made["unplaced"].pk]["shards"] == [] and "start" in by[made["unplaced"].pk]
    assert by[made["fetching"].pk]["start"]["measured"]
    assert {"pool", "fabric", "endpoint"} <= set(by[made["ready"].pk])


def test_with_no_download_shown_the_rows_give_the_same_list_too():
    """No shard pending or fetching: the agents' reports are not read, and nothing in the list changes."""
    now = timezone.now()
    made = varied_fleet(now)
    Shard.objects.filter(state__in=("pending", "fetching")).update(state="starting")
    assert reads.replica_list(now=now) == reference_list(None, now)
    listed = reads.replica_list(now=now)
    assert not any("fetch" in s for r in listed for s in r["shards"])
    assert len(listed) == len(made)


def queries_of_list() -> list[str]:
    with CaptureQueriesContext(connection) as seen:
        reads.replica_list()
    return [q["sql"] for q in seen]


def grow(prefix: str, nodes: int) -> None:
    """More nodes, each with a ready replica, a starting one fetching its weights and a two-node one."""
    ingest_fleet(f"h100-hgx:{nodes}@south", prefix=prefix)
    llama = add_model() if not Replica.objects.exists() else Replica.objects.first().model
    names = list(Node.objects.filter(name__startswith=prefix).values_list("name", flat=True))
    for name, other in zip(names, names[1:] + names[:1], strict=True):
        place(llama, name, [0, 1])
        starting = place(llama, name, [2], state="starting", shard_state="fetching")
        Shard.objects.filter(replica=starting).update(fetch_done=1)
        wide = place(llama, name, [3])
        shard(wide, other, 1, [4, 5])
        Node.objects.filter(name=name).update(shard_status=[{"id": "x-0", "fetch": {"bytes_done": 3}}])


def test_the_list_takes_as_many_queries_for_thirty_replicas_as_for_three():
    grow("a-", 1)
    three = queries_of_list()
    assert len(reads.replica_list()) == 3
    grow("b-", 9)
    assert len(reads.replica_list()) == 30
    assert len(queries_of_list()) == len(three)
