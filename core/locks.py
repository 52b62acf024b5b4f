"""A lock that keeps a periodic task from running twice at once, on any host.

It is a row lock on the task's TaskRun row, taken with NOWAIT: a second
worker that finds it held skips this run instead of queueing behind it (the
next beat comes soon enough).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from django.db import OperationalError, connection, transaction

from core.models import TaskRun


@contextmanager
def exclusive(name: str) -> Iterator[bool]:
    """Yields True when this caller holds the lock, False when another does."""
    TaskRun.objects.get_or_create(name=name)
    with transaction.atomic():
        try:
            query = TaskRun.objects.filter(name=name)
            if connection.features.has_select_for_update_nowait:
                query = query.select_for_update(nowait=True)
            list(query)
        except OperationalError:
            yield False
            return
        yield True
