"""Catalog's periodic work: following the configuration file."""

from __future__ import annotations

from pathlib import Path

from celery import shared_task
from django.conf import settings
from django.utils import timezone

from catalog import loader
from catalog.models import CatalogFile
from core.locks import exclusive
from core.runs import Run

LOCK = "catalog.tasks.load_catalog_file"


@shared_task(name="catalog.tasks.load_catalog_file", ignore_result=True, base=Run)
def load_catalog_file() -> dict:
    """Read ``LLMGW_CATALOG_FILE`` when its bytes changed; nothing to do when it is not set.

    The first run after start finds no digest matching (or none at all) only
    if the file changed while the control plane was down; either way a run
    reads it at start. A model the file removed that is already gone is
    simply not removed again.
    """
    path = getattr(settings, "LLMGW_CATALOG_FILE", None)
    if not path:
        return {"skipped": "LLMGW_CATALOG_FILE is not set"}
    with exclusive(LOCK) as held:
        if not held:
            return {"skipped": "another worker holds the lock"}
        state, _ = CatalogFile.objects.get_or_create(path=str(path))
        result = loader.load(Path(path), last_digest=state.digest or None)
        if not result.skipped:
            # Bytes already read are not read again until they change, even
            # with problems: the problems stay on the row for operators to see.
            state.digest = result.digest or state.digest
            state.loaded_at = timezone.now()
            state.problems = result.problems
            state.save()
    return {"changed": result.changed, "removed": result.removed, "problems": result.problems}
