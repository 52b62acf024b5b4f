"""Time columns read as whole microseconds since the epoch, for large reads that only subtract them.

Django's PostgreSQL adapter builds an aware datetime in Python for each
``timestamptz`` it reads (a regular expression and a ``replace`` per value):
at 7,900 replicas that was 100 ms of a 260 ms replica list whose only use of
the times was how many whole seconds ago they were. Here the column is read
as an integer instead (``EXTRACT(EPOCH ...)`` is exact, a numeric to the
microsecond, from PostgreSQL 14 on).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from django.db.models import BigIntegerField, Func, QuerySet

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


class EpochMicroseconds(Func):
    """A ``timestamptz`` column as whole microseconds since the epoch (NULL stays NULL)."""

    template = "(EXTRACT(EPOCH FROM %(expressions)s) * 1000000)::bigint"
    output_field = BigIntegerField()


def with_microseconds(rows: QuerySet, **columns: str) -> QuerySet:
    """``rows`` annotated with each of ``columns`` (new name → datetime column) as microseconds since the epoch."""
    return rows.annotate(**{name: EpochMicroseconds(column) for name, column in columns.items()})


def datetime_of(us: int) -> datetime:
    """Microseconds since the epoch as the aware datetime (UTC) they count to."""
    return EPOCH + timedelta(microseconds=us)


def now_microseconds(now: datetime) -> int:
    """An aware datetime as microseconds since the epoch."""
    return (now - EPOCH) // _MICROSECOND


def whole_seconds_since(now_us: int, then_us: int) -> int:
    """``max(0, int((now - then).total_seconds()))``, from microseconds: whole seconds ago, 0 for the future.

    The same integer: ``total_seconds()`` divides the exact microseconds by a
    million and rounds to the nearest float, which stays below the next whole
    second for any span shorter than some 280 years; ``int`` then drops
    the fraction as floor division does for a span that is not negative.
    """
    return max(0, (now_us - then_us) // 1_000_000)
