"""Pulling a model's weights onto nodes before anything runs there, so a start lands on a warm disk.

An operator (``llmgw ctl prefetch``, ``POST /api/v1/models/{name}/prefetch``)
names the nodes, a pool, or a count; :func:`request` records one
:class:`~catalog.models.WeightPrefetch` per node. The heartbeat desk
(inventory/writes/heartbeats.py) hands each node its pending prefetches
(:func:`heartbeat_tables`, ``prefetch`` in the answer); the agent fetches
them with the code a shard's start uses and reports progress on each beat,
which ``heartbeats_flushed`` brings here (:func:`settle_prefetched`).
``catalog.apps`` connects both.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from catalog.models import CatalogModel, WeightPrefetch
from catalog.reads import source_refers_to
from inventory.models import GPU, Node
from inventory.signals import HeartbeatTables

# The most nodes one request may name or count: far beyond a pool, well short of a typo's damage.
MAX_NODES = 10_000


class PrefetchRefused(Exception):
    """A request that cannot be done as asked, with the status and the sentence the client gets."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


def choose_nodes(
    m: CatalogModel, *, pool: str | None = None, nodes: Sequence[str] | None = None, count: int | None = None
) -> list[str]:
    """The nodes to prefetch onto: the ones named; or every node of ``pool``; or ``count`` of them.

    With ``count``, nodes that already hold the weights (or have a prefetch
    of them under way) are skipped, and nodes with a GPU class one of the
    model's profiles uses come first; by name within each.
    """
    if nodes is not None:
        if pool is not None or count is not None:
            raise PrefetchRefused(400, "give nodes, or a pool and/or a count, not both")
        names = list(dict.fromkeys(nodes))
        known = set(Node.objects.filter(name__in=names, lost=False).values_list("name", flat=True))
        unknown = [n for n in names if n not in known]
        if unknown:
            raise PrefetchRefused(404, f"no node named {', '.join(map(repr, unknown))}; `llmgw ctl nodes` lists them")
        return names
    if pool is None and count is None:
        raise PrefetchRefused(400, "say where: nodes (a list of names), a pool, or a count")
    if count is not None and not (1 <= count <= MAX_NODES):
        raise PrefetchRefused(400, f"count must be between 1 and {MAX_NODES}")
    rows = Node.objects.filter(lost=False).order_by("name")
    candidates = [
        n for n, labels in rows.values_list("name", "labels") if pool is None or (labels or {}).get("pool") == pool
    ]
    if pool is not None and not candidates:
        raise PrefetchRefused(404, f"no node is in pool {pool!r}; a node's pool is its label pool=…")
    if count is None:
        return candidates
    return _warmest_last(m, candidates)[:count]


def _warmest_last(m: CatalogModel, names: list[str]) -> list[str]:
    """Nodes without the weights, the ones whose GPUs a profile uses first."""
    held = holders(m) | set(WeightPrefetch.objects.filter(model=m, error="").values_list("node", flat=True))
    classes = set(m.profiles.values_list("gpu_class", flat=True))
    fit = set(GPU.objects.filter(gpu_class__in=classes, node__name__in=names).values_list("node__name", flat=True))
    cold = [n for n in names if n not in held]
    return sorted(cold, key=lambda n: (n not in fit, n))


def holders(m: CatalogModel) -> set[str]:
    """The nodes whose last report shows a complete copy of the model's weights."""
    return holders_of([m])[m.pk]


def holders_of(models: Iterable[CatalogModel]) -> dict[int, set[str]]:
    """:func:`holders` of several models by id, reading the fleet's weights once (one query, whatever their number)."""
    models = list(models)
    out: dict[int, set[str]] = {m.pk: set() for m in models}
    sourced = [m for m in models if m.source]
    if not sourced:
        return out
    for node, weights in Node.objects.filter(lost=False).exclude(weights__isnull=True).values_list("name", "weights"):
        complete = [w for w in weights or [] if isinstance(w, dict) and not w.get("incomplete")]
        for m in sourced:
            if any(source_refers_to(m.source, w) for w in complete):
                out[m.pk].add(node)
    return out


def request(m: CatalogModel, nodes: list[str], actor: str, now: datetime | None = None) -> list[WeightPrefetch]:
    """Record a prefetch of ``m``'s weights onto each of ``nodes``; asking again starts one over."""
    if not m.source:
        raise PrefetchRefused(
            409, f"model {m.name!r} has no source to fetch: give it one (hf://…, file:///…, https://…)"
        )
    now = now or timezone.now()
    with transaction.atomic():
        for node in nodes:
            WeightPrefetch.objects.update_or_create(
                model=m,
                node=node,
                defaults={
                    "source": m.source,
                    "requested_at": now,
                    "requested_by": actor,
                    "updated_at": None,
                    "bytes_done": None,
                    "bytes_total": None,
                    "path": "",
                    "done_at": None,
                    "error": "",
                },
            )
    return list(WeightPrefetch.objects.filter(model=m, node__in=nodes).select_related("model"))


def pending_by_node() -> dict[str, list[dict]]:
    """Each node's prefetches not yet done, as the heartbeat answer carries them."""
    out: dict[str, list[dict]] = {}
    for node, model, source in (
        WeightPrefetch.objects.filter(done_at__isnull=True)
        .order_by("node", "model__name")
        .values_list("node", "model__name", "source")
    ):
        out.setdefault(node, []).append({"model": model, "source": source})
    return out


def heartbeat_tables(sender, **kwargs) -> HeartbeatTables:
    """``heartbeat_answers_wanted``: each node's pending prefetches."""
    return HeartbeatTables(prefetch=pending_by_node())


def settle_prefetched(sender, *, prefetched: list[tuple[str, dict]] = (), at: datetime | None = None, **kwargs) -> None:
    """``heartbeats_flushed``: the agents' progress on their prefetches, stored on the rows still pending.

    Only a row not yet done moves, and only for the source it was asked with:
    a report that crossed a new request for another source is not taken.
    """
    at = at or timezone.now()
    for node, entry in prefetched:
        rows = WeightPrefetch.objects.filter(
            node=node, model__name=entry.get("model"), source=entry.get("source"), done_at__isnull=True
        )
        fields: dict[str, Any] = {"updated_at": at}
        for key in ("bytes_done", "bytes_total"):
            value = entry.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                fields[key] = value
        state = entry.get("state")
        if state == "done":
            fields.update(done_at=at, path=str(entry.get("path") or "")[:1000], error="")
        elif state == "failed":
            fields.update(done_at=at, error=str(entry.get("error") or "the agent gave no reason")[:2000])
        rows.update(**fields)
