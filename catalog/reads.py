"""What the API and the console show of the catalog: models, measured capacity, orphaned weights.

Both call these functions, so the two never disagree. A key left out means
unknown or not set. The model listing with its replicas joins placement's
rows, so it is placement's (``placement.reads.model_list``); the
catalog's part of each entry is :func:`model_view`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlparse

from django.db.models import QuerySet

from catalog.definitions import ProfileSpec, profile_definition
from catalog.models import Adapter, CapacityMeasurement, CatalogModel, WeightPrefetch
from inventory.models import Node


def model_rows(name: str | None = None) -> QuerySet[CatalogModel]:
    """Every model (or the one called ``name``) by name, with what :func:`model_view` reads fetched alongside."""
    models = CatalogModel.objects.prefetch_related(
        "aliases", "adapters", "profiles", "fallbacks__target", "prefetches"
    ).order_by("name")
    if name is not None:
        models = models.filter(name=name)
    return models


def model_view(m: CatalogModel, counts: Mapping[str, int], unplaced: bool) -> dict[str, Any]:
    """One model with its scaling and profiles, and what placement says of it, which the caller reads.

    ``counts`` are its replicas, ``ready`` and in ``total`` (pending, starting
    and ready); ``unplaced`` is the scheduler's last word that it cannot place
    what the model wants. ``placement.reads.model_list`` reads both.
    """
    view: dict[str, Any] = {
        "name": m.name,
        "source": m.source,
        "min_replicas": m.min_replicas,
        "max_replicas": m.max_replicas,
        "on_demand": m.on_demand,
        "declared_in": m.declared_in,
        "read_only": m.read_only,
        "ready_replicas": counts.get("ready", 0),
        "total_replicas": counts.get("total", 0),
        "aliases": [a.name for a in m.aliases.all()],
        "fallbacks": [f.target.name for f in sorted(m.fallbacks.all(), key=lambda f: f.position)],
        "adapters": [{"name": a.name, "source": a.source} for a in m.adapters.all()],
        # The seeds' type: the profiles' names, which scripts join and print. The
        # full definitions sit beside them under a name of their own.
        "profiles": [p.name for p in m.profiles.all()],
        "profile_specs": [_profile_view(p.spec()) for p in m.profiles.all()],
        "parked": m.parked_at is not None,
        # The scheduler's last word was that it could not place what the model wants.
        "unplaceable": unplaced,
    }
    prefetches = sorted(m.prefetches.all(), key=lambda p: p.node)
    if prefetches:
        view["prefetch"] = [prefetch_view(p) for p in prefetches]
    if m.description:
        view["description"] = m.description
    if m.idle_timeout is not None:
        view["idle_timeout_seconds"] = int(m.idle_timeout.total_seconds())
    if m.parked_at is not None:
        view["parked_at"] = m.parked_at.isoformat()
        view["parked_error"] = m.parked_error
        view["failures"] = m.failure_streak
    return view


def prefetch_view(p: WeightPrefetch) -> dict[str, Any]:
    """One prefetch of a model's weights onto a node, as the API and ``ctl models`` show it."""
    view: dict[str, Any] = {
        "node": p.node,
        "state": p.state,
        "source": p.source,
        "requested_at": p.requested_at.isoformat(),
        "requested_by": p.requested_by,
        "bytes_done": p.bytes_done,
        "bytes_total": p.bytes_total,
    }
    if p.done_at is not None:
        view["done_at"] = p.done_at.isoformat()
    if p.path:
        view["path"] = p.path
    if p.error:
        view["error"] = p.error
    return view


def _profile_view(p: ProfileSpec) -> dict[str, Any]:
    """A profile as the API lists it: its definition, less the engine's arguments and environment."""
    view = profile_definition(p)
    view.pop("engine_args", None)
    view.pop("env", None)
    return view


# --- capacity -----------------------------------------------------------------------------


def capacity_view(row: CapacityMeasurement) -> dict[str, Any]:
    view = {
        "model": row.model_name,
        "profile": row.profile_name,
        "measured_at": row.measured_at.isoformat(),
        "measurement": row.measurement if isinstance(row.measurement, dict) else {},
    }
    if row.measured_by:
        view["measured_by"] = row.measured_by
    return view


def capacity_list() -> list[dict[str, Any]]:
    """Every stored measurement, kept by name so it outlives its model being removed and added again."""
    return [capacity_view(row) for row in CapacityMeasurement.objects.order_by("model_name", "profile_name")]


# --- weights nobody refers to -------------------------------------------------------------


def source_refers_to(source: str, weight: dict) -> bool:
    """Whether a catalog source names these weights on disk.

    ``hf://org/name[@rev]`` names the Hugging Face repository ``org/name``
    (a cache snapshot, or a directory whose path ends in it); ``file:///p``
    and a bare path name that path or anything under it; an ``https://`` URL
    names the file it downloads, by its file name.
    """
    path, name = str(weight.get("path") or ""), str(weight.get("name") or "")
    source = source.strip()
    if not source or not path:
        return False
    url = urlparse(source)
    if url.scheme == "hf":
        repo = (url.netloc + url.path).split("@", 1)[0].strip("/")
        return bool(repo) and (
            name == repo or path.rstrip("/").endswith("/" + repo) or f"models--{repo.replace('/', '--')}/" in path
        )
    if url.scheme in ("file", ""):
        target = (url.path if url.scheme == "file" else source).rstrip("/")
        return bool(target) and (path == target or path.startswith(target + "/") or target.startswith(path + "/"))
    if url.scheme in ("http", "https"):
        filename = url.path.rsplit("/", 1)[-1]
        return bool(filename) and path.rsplit("/", 1)[-1] == filename
    return False


def orphan_weights() -> list[dict[str, Any]]:
    """Weights on nodes' disks that no catalog model's or LoRA adapter's source refers to.

    Nodes that did not look for weights (``weights`` NULL) are left out: they
    hold nothing known, which is not the same as holding orphans.
    """
    sources = [s for s in CatalogModel.objects.values_list("source", flat=True) if s]
    sources += list(Adapter.objects.values_list("source", flat=True))
    prefetched = prefetched_paths()
    out = []
    for node, weights in Node.objects.exclude(weights__isnull=True).order_by("name").values_list("name", "weights"):
        for w in weights or []:
            if not isinstance(w, dict) or not w.get("path"):
                continue
            if any(source_refers_to(s, w) for s in sources) or is_prefetched(prefetched, node, str(w["path"])):
                continue
            out.append(_weight_view(node, w))
    return out


def prefetched_paths() -> dict[str, list[str]]:
    """Node → the paths its finished prefetches landed at, for models still in the catalog.

    A prefetched copy is kept while its model exists, even when the model's
    source has changed since: the operator asked for it (the row goes with the model).
    """
    out: dict[str, list[str]] = {}
    rows = WeightPrefetch.objects.filter(done_at__isnull=False, error="").exclude(path="")
    for node, path in rows.values_list("node", "path"):
        out.setdefault(node, []).append(path.rstrip("/"))
    return out


def is_prefetched(prefetched: dict[str, list[str]], node: str, path: str) -> bool:
    """Whether ``path`` on ``node`` is, or lies under, where a prefetch landed."""
    return any(path == p or path.startswith(p + "/") for p in prefetched.get(node, ()))


def _weight_view(node: str, w: dict) -> dict[str, Any]:
    view: dict[str, Any] = {"node": node, "path": str(w["path"])}
    for key, kind in (("name", str), ("format", str), ("bytes", int), ("incomplete", bool)):
        if isinstance(w.get(key), kind):
            view[key] = w[key]
    return view


def orphan_totals(orphans: list[dict]) -> dict[str, Any]:
    """How many and how large, by node: what collecting them would free."""
    nodes = Counter(o["node"] for o in orphans)
    return {"weights": len(orphans), "nodes": len(nodes), "bytes": sum(o.get("bytes", 0) for o in orphans)}
