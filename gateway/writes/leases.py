"""Leases: every reservation is held by a living gateway process, or given back.

A reservation is added to its budget's ``reserved_micros`` before a request
reaches an engine and taken back when its usage is written. A process that
dies in between (SIGKILL, out of memory, a lost host) would hold it for
ever, and enough of those make a budget refuse everyone. So each process
also records what it holds, per budget, in a ``Lease`` row, in the same
statement or transaction that changes the budget, and keeps its
``LeaseHolder`` row renewed while it lives. The reaper (``reap``, a
periodic Celery task) deletes the leases of processes whose renewals have
stopped and sets each budget's ``reserved_micros`` back to what the
remaining leases hold.

The invariant all of this keeps: at every committed moment, a budget's
``reserved_micros`` is the sum of its leases' ``micros``. Every writer of
a lease holds its budget's row lock first (a reservation's UPDATE, a
settlement's first statement, the reaper's SELECT … FOR UPDATE), so the
rows are taken in one order (budget, then lease) and never deadlock.

Why a holder row renewed by the process, not an expiry per request: a
request may stream for as long as LLMGW_UPSTREAM_READ_TIMEOUT_S allows
between tokens, without bound in total, and a renewal per request would be
a write per request per period. A process renews once per
LLMGW_GATEWAY_LEASE_S / 4 for everything it holds; each reservation also
pushes its lease's own expiry forward, which covers a process that dies
before its first renewal.
"""

from __future__ import annotations

import os
import secrets
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import connection, transaction
from django.db.models import Exists, F, OuterRef, Subquery, Sum
from django.db.models.functions import Coalesce

from gateway import conf
from gateway.models import Budget, Lease, LeaseHolder

# Renewals per lease: three may fail in a row (a database blip) before the lease runs out.
RENEWALS_PER_LEASE = 4

_owner: tuple[int, str] | None = None


def owner() -> str:
    """This process's name on its leases: host, pid and a random part, new in every process."""
    global _owner
    pid = os.getpid()
    if _owner is None or _owner[0] != pid:
        _owner = (pid, f"{socket.gethostname()[:40]}:{pid}:{secrets.token_hex(4)}")
    return _owner[1]


def lease_s() -> float:
    return conf.get().lease_s


def params(now: datetime) -> dict:
    """The lease parameters a reservation's statements take (``hold_sql``)."""
    return {"lease_owner": owner(), "lease_until": now + timedelta(seconds=lease_s())}


def _table() -> str:
    return connection.ops.quote_name(Lease._meta.db_table)


def hold_sql(reserved: str | None = None) -> str:
    """Add a reservation to this process's lease on its budget; run after the budget's UPDATE, in its transaction.

    ``reserved`` names a WITH query whose ``id`` column is the budget just
    reserved (gateway.pgpath's one-statement admission: nothing is held when
    it reserved nothing); None takes the budget from ``%(budget_id)s``.
    Parameters: ``reserve_params``'s (``estimate``, ``lease_owner``, ``lease_until``).
    """
    t = _table()
    values = "VALUES (%(lease_owner)s, %(budget_id)s, %(estimate)s, %(lease_until)s)"
    if reserved is not None:
        values = f"SELECT %(lease_owner)s, id, %(estimate)s, %(lease_until)s FROM {reserved}"
    return (
        f"INSERT INTO {t} (owner, budget_id, micros, expires_at) {values} "
        f"ON CONFLICT (owner, budget_id) DO UPDATE SET micros = {t}.micros + excluded.micros, "
        f"expires_at = excluded.expires_at"
    )


def give_back_statements(budget_id: int, reserved: int) -> list[tuple[str, dict]]:
    """Take ``reserved`` micros back from the budget and this process's lease on it, never more than the lease holds.

    Run after a statement that locked the budget's row (the settlement's
    charge). What the lease no longer holds was given back by the reaper
    already (this process was taken for dead), so it is not given back twice.
    """
    t, b = _table(), connection.ops.quote_name(Budget._meta.db_table)
    taken = "(CASE WHEN micros < %(reserved)s THEN micros ELSE %(reserved)s END)"
    p = {"reserved": reserved, "budget_id": budget_id, "lease_owner": owner()}
    mine = "owner = %(lease_owner)s AND budget_id = %(budget_id)s"
    return [
        (
            f"UPDATE {b} SET reserved_micros = reserved_micros - "
            f"COALESCE((SELECT {taken} FROM {t} WHERE {mine}), 0) WHERE id = %(budget_id)s",
            p,
        ),
        (f"UPDATE {t} SET micros = micros - {taken} WHERE {mine}", p),
    ]


def renew(now: datetime) -> None:
    """This process is alive: its leases hold for another LLMGW_GATEWAY_LEASE_S."""
    LeaseHolder.objects.update_or_create(owner=owner(), defaults={"expires_at": now + timedelta(seconds=lease_s())})


def release(now: datetime) -> None:
    """This process is stopping with nothing in flight: its empty leases and its holder row go."""
    with transaction.atomic():
        Lease.objects.filter(owner=owner(), micros=0).delete()
        if not Lease.objects.filter(owner=owner()).exists():
            LeaseHolder.objects.filter(owner=owner()).delete()


@dataclass(frozen=True)
class Reaped:
    leases: int
    """Leases of dead processes deleted."""
    budgets: int
    """Budgets whose reserved_micros was set back to what their leases hold."""
    micros: int
    """Micros given back to those budgets in all."""


def _dead(now: datetime):
    live = LeaseHolder.objects.filter(owner=OuterRef("owner"), expires_at__gte=now)
    return Lease.objects.filter(expires_at__lt=now).exclude(Exists(live))


def _held(budget_ids: Iterable[int]) -> dict[int, int]:
    rows = Lease.objects.filter(budget_id__in=list(budget_ids)).values("budget_id").annotate(held=Sum("micros"))
    return {row["budget_id"]: row["held"] or 0 for row in rows}


def reap(now: datetime) -> Reaped:
    """Give back what dead processes held, and set every budget's reserved_micros to what its leases hold.

    1. Find the budgets with a dead lease (expired, its holder not renewed
       since), and those whose reserved_micros is not what their leases hold
       (reserved before leases existed, or cleared by hand).
    2. Lock those budgets, in id order: no reservation or settlement of
       theirs can run meanwhile.
    3. Delete their dead leases, and set reserved_micros to the sum of the
       leases left.
    """
    held = Lease.objects.filter(budget=OuterRef("pk")).values("budget").annotate(s=Sum("micros")).values("s")
    off = Budget.objects.annotate(held=Coalesce(Subquery(held), 0)).exclude(reserved_micros=F("held"))
    candidates = set(_dead(now).values_list("budget_id", flat=True)) | set(off.values_list("id", flat=True))
    if not candidates:
        return Reaped(0, 0, 0)
    with transaction.atomic():
        locked = Budget.objects.select_for_update().filter(id__in=candidates).order_by("id")
        before = dict(locked.values_list("id", "reserved_micros"))
        deleted, _ = _dead(now).filter(budget_id__in=before).delete()
        now_held = _held(before)
        changed = 0
        for budget_id, reserved in sorted(before.items()):
            target = now_held.get(budget_id, 0)
            if target != reserved:
                Budget.objects.filter(id=budget_id).update(reserved_micros=target)
                changed += 1
        LeaseHolder.objects.filter(expires_at__lt=now).exclude(owner__in=Lease.objects.values("owner")).delete()
    given = sum(max(0, reserved - now_held.get(b, 0)) for b, reserved in before.items())
    return Reaped(deleted, changed, given)
