"""Deletions an operator asked for, re-checked against the catalog until an agent acts on them.

A collect request names weights no model referred to *then*. A model added
or edited since may refer to them again; such a deletion is cancelled, never
handed out. It is checked:

1. when a catalog model is saved (``catalog.apps`` connects :func:`model_saved`);
2. at each collect request (:func:`cancel_referred` before new rows are written);
3. at hand-out, whenever the agents' list is built (:func:`pending_by_node`,
   :func:`pending_for`), which also catches a change no signal saw;
4. on the node, where the agent refuses weights its own shards use (agent/collect.py).

The heartbeat desk (inventory/writes/heartbeats.py) hands out :func:`heartbeat_tables`
and reports what agents did through ``heartbeats_flushed``
(:func:`settle_collected`); ``catalog.apps`` connects both.

A cancelled row is kept, done, with the reason in ``error``.
"""

from __future__ import annotations

from datetime import datetime

from django.db import transaction
from django.utils import timezone

from catalog.models import CatalogModel, WeightCollection
from catalog.reads import is_prefetched, prefetched_paths, source_refers_to
from inventory.signals import HeartbeatTables


def _pending(node: str | None = None) -> list[tuple[int, str, str, str]]:
    rows = WeightCollection.objects.filter(done_at__isnull=True)
    if node is not None:
        rows = rows.filter(node=node)
    return list(rows.order_by("node", "path").values_list("pk", "node", "path", "name"))


def _still_wanted(rows: list[tuple[int, str, str, str]]) -> list[tuple[int, str, str, str]]:
    """The rows no model refers to; the others are cancelled, each with the model that claims it."""
    if not rows:
        return rows  # the common case, at every heartbeat flush: nothing pending, no catalog query
    sources = [(n, s) for n, s in CatalogModel.objects.exclude(source="").values_list("name", "source")]
    prefetched = prefetched_paths()
    wanted, now = [], timezone.now()
    for row in rows:
        weight = {"path": row[2], "name": row[3]}
        claimed = next((name for name, source in sources if source_refers_to(source, weight)), None)
        if claimed is None and not is_prefetched(prefetched, row[1], row[2]):
            wanted.append(row)
            continue
        why = (
            f"model {claimed!r} refers to these weights again"
            if claimed
            else "they were prefetched for a model still in the catalog"
        )
        # Only a row still pending is cancelled: an agent's report may have settled it meanwhile.
        WeightCollection.objects.filter(pk=row[0], done_at__isnull=True).update(
            done_at=now, error=f"cancelled: {why}; not deleted"
        )
    return wanted


def cancel_referred() -> None:
    """Cancel every pending deletion a catalog model refers to now."""
    _still_wanted(_pending())


def pending_by_node() -> dict[str, list[str]]:
    """Each node's paths to delete, re-checked against the catalog as it is now."""
    out: dict[str, list[str]] = {}
    for _, node, path, _ in _still_wanted(_pending()):
        out.setdefault(node, []).append(path)
    return out


def model_saved(sender, instance: CatalogModel, **kwargs) -> None:
    """A model was added or changed: once that commits, cancel what it refers to."""
    if instance.source:
        transaction.on_commit(cancel_referred)


def heartbeat_tables(sender, **kwargs) -> HeartbeatTables:
    """``heartbeat_answers_wanted``: each node's deletions, re-checked against the catalog at each refresh.

    What a model refers to again is cancelled here, not handed out.
    """
    return HeartbeatTables(collect=pending_by_node())


def settle_collected(sender, *, collected: list[tuple[str, dict]], at: datetime | None, **kwargs) -> None:
    """``heartbeats_flushed``: mark the deletions agents reported: done, or the reason they could not."""
    for node, done in collected:
        rows = WeightCollection.objects.filter(node=node, path=done.get("path"), done_at__isnull=True)
        rows.update(done_at=at or timezone.now(), error=str(done.get("error") or "")[:2000])
