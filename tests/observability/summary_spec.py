"""The fleet summary's counts as the node and replica lists define them: the specification ``fleet_sql`` is held to.

The summary counts in PostgreSQL (observability.fleet_sql); these are the
same counts worked out in Python from ``node_list`` and ``replica_list``, row
by row, for tests to compare on the same fleet.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from observability.fleet_summary import IDLE_THRESHOLD


def node_totals(nodes: list[dict]) -> dict[str, int]:
    """By the states that need different responses; an unreachable node counts there whatever its state."""
    totals = {"total": len(nodes), "ready": 0, "cordoned": 0, "draining": 0, "unreachable": 0}
    for n in nodes:
        totals["unreachable" if not n["reachable"] else n["state"]] += 1
    return totals


def fabrics(nodes: list[dict]) -> list[dict[str, Any]]:
    """Per declared fabric: nodes, how many hold weights and of how many models, the largest free block.

    Per fabric because that is where the answer is actionable: a multi-node
    replica never spans two, and weights seeded into one fabric are not
    weights in another.
    """
    out: dict[str, dict[str, Any]] = {}
    models: dict[str, set[str]] = defaultdict(set)
    for n in nodes:
        for f in n.get("fabrics", []):
            u = out.setdefault(f, {"fabric": f, "nodes": 0, "nodes_with_weights": 0, "largest_free_block": 0})
            u["nodes"] += 1
            if n.get("models_on_disk"):
                u["nodes_with_weights"] += 1
                models[f].update(n["models_on_disk"])
            # Entirely free, which is what a multi-node replica needs.
            if n["reachable"] and n["state"] == "ready" and n["gpu_total"] and n["gpu_free"] == n["gpu_total"]:
                u["largest_free_block"] += 1
    for f, u in out.items():
        u["models_present"] = len(models[f])
    return [out[k] for k in sorted(out)]


def replica_totals(replicas: list[dict]) -> dict[str, int]:
    totals = {"total": len(replicas), "ready": 0, "starting": 0, "stopping": 0, "failed": 0, "fetching": 0, "stale": 0}
    for r in replicas:
        totals["starting" if r["state"] == "pending" else r["state"]] += 1
        if any("fetch" in s for s in r["shards"]):
            totals["fetching"] += 1
        if r["stale"]:
            totals["stale"] += 1
    return totals


def idle(replicas: list[dict]) -> list[dict[str, Any]]:
    """Ready replicas nothing asked for in a while: with more models than GPUs, the first place to find room."""
    idle = [
        {"id": r["id"], "model": r["model"], "idle_seconds": r["idle_seconds"], "gpus": r["gpus"]}
        for r in replicas
        if r["state"] == "ready" and r["idle_seconds"] >= IDLE_THRESHOLD.total_seconds()
    ]
    return sorted(idle, key=lambda r: -r["idle_seconds"])
