"""The suite's hand inside the server's database: a Python process with the server's environment.

Run as ``python -m tests.hostile.orm`` with the environment ``llmgw serve``
was given. It reads one JSON request a line on stdin (``{"call": NAME,
"args": {...}}``) and answers one JSON line on stdout; NAME is one of the
functions below. Used for what no API writes (replicas on given GPUs, a
price, a scan handed to a node) and for what the periodic tasks would do,
since the suite's server runs without its worker so that nothing moves under
the snapshots but the requests themselves.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from typing import Any

FLEET_MODEL = {
    "name": "hostile-fleet",
    "source": "hf://meta-llama/Llama-3.1-8B-Instruct",
    "scaling": {"min": 0, "max": 3},
    "profiles": [
        {"name": "h100", "engine": "vllm", "gpu_class": "h100-80g", "gpus": 1},
        {"name": "h100x2", "engine": "vllm", "gpu_class": "h100-80g", "gpus": 1, "nodes": 2, "pp": 2},
    ],
}
CHAT_MODEL = {
    "name": "hostile-chat",
    "source": "https://example.org/qwen2.5-0.5b-instruct-q4_k_m.gguf",
    "scaling": {"min": 1, "max": 1},
    "profiles": [{"name": "cpu", "engine": "llamacpp", "gpu_class": "cpu", "memory_gb": 2, "gpus": 0}],
}


def _replica(model, profile, shards: list[tuple[str, int, list[int]]]):
    """A replica starting on the given (node, rank, GPUs), as the reconciler would have written it."""
    from inventory.models import Node
    from placement.models import Replica, Shard

    replica = Replica.objects.create(
        model=model,
        profile=profile,
        profile_name=profile.name,
        profile_fingerprint=profile.fingerprint,
        state="starting",
    )
    for node, rank, gpus in shards:
        Shard.objects.create(
            replica=replica, node=Node.objects.get(name=node), rank=rank, gpu_indices=gpus, state="starting"
        )
    return replica.id


def setup(a: str, b: str, engine_url: str) -> dict[str, Any]:
    """Replicas on nodes A and B (one each, one across both with rank 0 on B), a served model, a key.

    Answers the ids the agents' heartbeats name, and the gateway key's secret.
    """
    from catalog import writes as service
    from catalog.models import WeightCollection
    from gateway.models import ApiKey, Budget, Price
    from gateway.writes import keys
    from placement.models import Replica

    fleet = service.add_model(FLEET_MODEL, actor="hostile")
    single, double = list(fleet.profiles.order_by("position"))
    ids = {
        "ra": _replica(fleet, single, [(a, 0, [0])]),
        "rb": _replica(fleet, single, [(b, 0, [0])]),
        "rab": _replica(fleet, double, [(b, 0, [1]), (a, 1, [1])]),
    }
    chat = service.add_model(CHAT_MODEL, actor="hostile")
    Price.objects.create(model=chat, prompt_micros_per_million=1_000_000, completion_micros_per_million=2_000_000)
    ids["rg"] = Replica.objects.create(
        model=chat, profile_name="cpu", state="ready", endpoint=engine_url, profile=chat.profiles.get()
    ).id
    issued = keys.issue(team="hostile-gw", org="hostile-org", models=["hostile-chat"], name="hostile")
    key = ApiKey.objects.get(pk=issued.key.id)
    Budget.objects.create(scope="team", team=key.team, amount_micros=10**12, period="month")
    ids["gateway_key"] = issued.secret
    for node in (a, b):
        WeightCollection.objects.create(node=node, path=f"/models/old-{node}", name="old", bytes=10**9)
    return ids


def arm_scan(node: str, fabric: str) -> dict | None:
    """Ask for a scan of ``fabric``, plan it as the periodic task would, and hand it to ``node``.

    Answers the scan the node now holds (what its report answer carried, or
    would have), or None when the planner gave it to nobody or another node.
    """
    from django.utils import timezone

    from inventory.models import FabricScan, Node
    from inventory.writes import scans

    now = timezone.now()
    holder = Node.objects.get(name=node)
    scans.request_scan(fabric)
    scans.plan_scans(now)
    scans.scan_for(holder, now)
    held = FabricScan.objects.filter(
        fabric_key=fabric, node=holder, assigned_at__isnull=False, pending_since__isnull=False
    ).first()
    return {"fabric": held.fabric_key, "hca": held.hca, "port": held.port} if held else None


CALLS = {"setup": setup, "arm_scan": arm_scan}


def serve() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmgw.settings")
    import django

    django.setup()
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        try:
            answer = {"ok": CALLS[request["call"]](**request.get("args", {}))}
        except Exception:  # noqa: BLE001 - sent back whole, to fail the suite's call with it
            answer = {"error": traceback.format_exc()}
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    serve()
