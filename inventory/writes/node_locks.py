"""The one order in which a writer locks many ``inventory_node`` rows: ascending id.

Two writers change many nodes in one transaction: the heartbeat flusher
(every node that beat in the last second) and the reachability sweep (every
node gone silent, then every node silent long enough to be lost). PostgreSQL
locks a row when a statement first updates or selects it ``FOR UPDATE``, in
whatever order the statement meets the rows: the flusher met them in the
order the beats arrived, the sweep's ``UPDATE … WHERE id IN (…)`` in the
order of its scan. At 10,000 nodes the two held halves of each other's rows
and PostgreSQL aborted one (tests/inventory/test_lock_order.py makes that
meeting certain).

So every such writer first selects its rows ``FOR UPDATE ORDER BY id``
(:func:`locked`): PostgreSQL sorts before it locks, so the locks are taken
in id order, two writers wait on each other's lowest common row instead of
crossing, and the rows are read again under the lock — a writer decides on
what is there now, not on what it read before another committed. Ascending
id because it is the one order every writer can name without reading
anything first, and the primary key's index hands it out cheaply.

Writers of a single node (a full report, a state change) hold one row and
cannot cross anyone. A deadlock from somewhere this does not foresee is
retried once (:func:`once_more_on_deadlock`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

from django.db import OperationalError
from django.db.models import QuerySet

log = logging.getLogger(__name__)

T = TypeVar("T")

DEADLOCK = "40P01"  # PostgreSQL's SQLSTATE for "deadlock detected"


def locked(rows: QuerySet) -> QuerySet:
    """These node rows, locked in ascending id when evaluated (inside a transaction)."""
    return rows.order_by("pk").select_for_update()


def is_deadlock(exc: BaseException) -> bool:
    return getattr(exc.__cause__, "sqlstate", None) == DEADLOCK


def once_more_on_deadlock(write: Callable[[], T], what: str) -> T:
    """Run a transaction; when PostgreSQL chose it as a deadlock's victim (it was rolled back whole), run it again."""
    try:
        return write()
    except OperationalError as exc:
        if not is_deadlock(exc):
            raise
        log.warning("%s deadlocked with another writer of nodes; trying once more", what)
        return write()
