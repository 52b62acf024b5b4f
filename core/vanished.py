"""Writes that let go of themselves when a row they point at was deleted by another transaction.

A long transaction that reads, decides, then writes (the reconciler's pass)
meets rows deleted since it read them: a model removed through the API, a
profile dropped by a redefinition, a node forgotten. Django declares every
foreign key ``DEFERRABLE INITIALLY DEFERRED``, so on PostgreSQL one row
pointing at a deleted one is found only at the commit, and fails the whole
transaction there, every other write with it.

:func:`keys_checked_at_once` has PostgreSQL check the keys at each statement
instead, and :func:`unless_gone` wraps one write in a savepoint that is rolled
back, and named, when its key points at nothing. A key checked at once also
holds the row it points at (PostgreSQL's FOR KEY SHARE) until the commit, so
what a write found there cannot be deleted before the write is committed.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from django.db import DatabaseError, connection, transaction

log = logging.getLogger(__name__)

# PostgreSQL's SQLSTATEs for a key that points at nothing, and for a deadlock it broke by failing this statement
# (a deletion that locked its row first and waits for a row this transaction wrote earlier: giving up the one
# write lets both go on).
_GONE = {"23503": "a row it points at was deleted", "40P01": "a deletion of a row it points at was under way"}


@contextmanager
def keys_checked_at_once() -> Iterator[None]:
    """Inside the block, every foreign key is checked by the statement that writes it.

    Left as they were (deferred) if the block raises: its transaction is then rolled back anyway.
    """
    with connection.cursor() as cursor:
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
    yield
    with connection.cursor() as cursor:
        cursor.execute("SET CONSTRAINTS ALL DEFERRED")


@contextmanager
def unless_gone(what: str, skipped: list[str]) -> Iterator[None]:
    """Run the block in a savepoint; if a row it points at is gone, undo the block and append ``what`` to ``skipped``.

    Only a key that points at nothing (or the deadlock of a deletion under way) is let go; any other error is
    raised. Meant for use under :func:`keys_checked_at_once`: with deferred keys nothing fails before the commit.
    """
    try:
        with transaction.atomic():
            yield
    except DatabaseError as error:
        why = _GONE.get(getattr(error.__cause__, "sqlstate", None) or "")
        if why is None:
            raise
        log.info("%s was not written: %s meanwhile (%s)", what, why, str(error).splitlines()[0])
        skipped.append(what)
