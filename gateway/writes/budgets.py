"""Budgets: reserve before a request reaches an engine, settle when it ends.

A request reserves its estimated cost on every budget above it (its key's,
its team's, its organisation's) in one transaction, with a conditional
``UPDATE … WHERE spent + reserved + estimate <= amount``: PostgreSQL re-checks
that condition against the latest version of the row after waiting for any
concurrent reservation, so two requests can never both take the last of a
budget. When the request ends its reservation is taken back and its real cost
added to ``spent`` (gateway.writes.usage does that, batched).

What a budget can be overrun by is therefore only what requests already in
flight cost beyond their estimates. The estimate is an upper bound of the
prompt's tokens (gateway.tokens.Prompt.bound) plus the request's length
(gateway.tokens.per_choice, else LLMGW_BUDGET_DEFAULT_COMPLETION_TOKENS) for
every choice, at the price of the model that serves (a fallback is
re-admitted at its own price, see gateway.admission); the engine is sent that
length in every field it may read one from (gateway.tokens.bounded), and
what it reports past the bounds is taken at the bounds (gateway.tokens.within),
so no body and no engine overruns. A request that cost more than it reserved all the same is charged
in full: ``spent`` may then pass the amount, and every later request is
refused until the period rolls over, since reserving needs ``spent < amount``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import connection, transaction

from gateway.models import Budget, Period, Scope
from gateway.writes import leases

MILLION = 1_000_000
# The most micros one estimate, or one budget's amount, may be: admission adds spent, reserved
# and an estimate in SQL, and with each below 2**61 that sum stays inside a bigint whatever a
# client asks for (an n × max_tokens × price past it is simply more than any budget holds).
MAX_MICROS = 2**61


def cost_micros(prompt_tokens: int, completion_tokens: int, price: tuple[int, int] | None) -> int:
    """The cost of a request in micros, rounded up; None price (no price set) costs nothing.

    Rounded up so that many tiny requests cannot each round down to free.
    """
    if price is None:
        return 0
    total = prompt_tokens * price[0] + completion_tokens * price[1]
    return min(-(-total // MILLION), MAX_MICROS)


def period_start(period: str, now: datetime) -> datetime:
    """Start of the current day, week (Monday) or month, in UTC."""
    day = now.replace(hour=0, minute=0, second=0, microsecond=0)
    if period == Period.DAY:
        return day
    if period == Period.WEEK:
        return day - timedelta(days=day.weekday())
    return day.replace(day=1)


def _starts(now: datetime) -> dict[str, datetime]:
    return {p.value: period_start(p, now) for p in (Period.DAY, Period.WEEK, Period.MONTH)}


def _table() -> str:
    return connection.ops.quote_name(Budget._meta.db_table)


# The start of each row's current period, chosen by its own period column.
# Named parameters: on PostgreSQL each is sent once however often it is used.
CURRENT = "(CASE period WHEN 'day' THEN %(day)s WHEN 'week' THEN %(week)s ELSE %(month)s END)"
# What the row has spent in its current period: nothing when the period has rolled over.
SPENT = f"(CASE WHEN period_start < {CURRENT} THEN 0 ELSE spent_micros END)"


@dataclass(frozen=True)
class Refusal:
    budget_id: int
    sentence: str


def spent_now(budget: Budget, now: datetime) -> int:
    """What a budget has spent in the current period (0 when its period rolled over)."""
    return 0 if budget.period_start < period_start(budget.period, now) else budget.spent_micros


def describe(budget: Budget) -> str:
    scope = {Scope.ORG: "organisation", Scope.TEAM: "team", Scope.KEY: "key"}[budget.scope]
    every = {Period.DAY: "daily", Period.WEEK: "weekly", Period.MONTH: "monthly"}[budget.period]
    return f"the {every} budget of {scope} {budget.owner_name!r}"


def explain_refusal(budget_ids: list[int], estimate: int, now: datetime) -> Refusal:
    """Which of the budgets cannot take the estimate, in words (the first, top of the tree first)."""
    order = {Scope.ORG: 0, Scope.TEAM: 1, Scope.KEY: 2}
    budgets = sorted(
        Budget.objects.select_related("org", "team", "key").filter(id__in=budget_ids),
        key=lambda b: order[b.scope],
    )
    for b in budgets:
        spent = spent_now(b, now)
        if spent >= b.amount_micros:
            return Refusal(b.id, f"{describe(b)} is spent ({spent} of {b.amount_micros} micros this {b.period})")
        if spent + b.reserved_micros + estimate > b.amount_micros:
            left = b.amount_micros - spent - b.reserved_micros
            return Refusal(
                b.id,
                f"{describe(b)} cannot cover this request: about {estimate} micros asked, {max(left, 0)} left "
                f"this {b.period} after the requests in flight",
            )
    # Only reached when a budget changed between the update and this read.
    return Refusal(budget_ids[0], "a budget over this key cannot cover this request now; try again")


def reserve_sql(target: str = "%(budget_id)s") -> str:
    """Reserve on one budget if it can take the estimate: a conditional UPDATE.

    ``target`` is the SQL giving the budget's id: a parameter, or a subquery
    (gateway.pgpath's one-statement admission). Parameters from ``reserve_params``.
    """
    return (
        f"UPDATE {_table()} SET "
        f"spent_micros = {SPENT}, "
        f"period_start = CASE WHEN period_start < {CURRENT} THEN {CURRENT} ELSE period_start END, "
        f"reserved_micros = reserved_micros + %(estimate)s "
        f"WHERE id = {target} AND {SPENT} < amount_micros AND {SPENT} + reserved_micros + %(estimate)s <= amount_micros"
    )


def reserve_params(estimate: int, now: datetime, **target) -> dict:
    """Parameters for ``reserve_sql``; ``target`` those of its target (``budget_id=`` for the plain one)."""
    return {**_starts(now), "estimate": estimate, **leases.params(now), **target}


def reserve(budget_ids: list[int], estimate: int, now: datetime) -> Refusal | None:
    """Reserve ``estimate`` micros on every budget, all or none; None when reserved.

    One conditional UPDATE per budget, in id order (as settle goes), so two
    transactions touching the same budgets never wait on each other in a
    circle; each followed by this process's lease on it (gateway.writes.leases).
    """
    if not budget_ids:
        return None
    sql = reserve_sql()
    failed = None
    with transaction.atomic(), connection.cursor() as cursor:
        for budget_id in sorted(budget_ids):
            params = reserve_params(estimate, now, budget_id=budget_id)
            cursor.execute(sql, params)
            if cursor.rowcount != 1:
                failed = budget_id
                transaction.set_rollback(True)
                break
            cursor.execute(leases.hold_sql(), params)
    if failed is None:
        return None
    return explain_refusal([failed], estimate, now)


Statement = tuple[str, list | dict]
"""One SQL statement and its parameters, for a Django cursor or a psycopg connection alike."""


def settle_statements(charges: Iterable[tuple[int, int, int]], now: datetime) -> list[Statement]:
    """Take back reservations and add real costs: (budget id, reserved, cost) each.

    What is taken back is taken from this process's leases too, and never
    more than they hold (gateway.writes.leases.give_back_statements).

    Costs land in the budget's current period, even when the request was
    reserved in the previous one: that is when the money was spent. One
    statement per budget, in id order, so two writers settling the same
    budgets never deadlock.
    """
    totals: dict[int, list[int]] = {}
    for budget_id, reserved, cost in charges:
        total = totals.setdefault(budget_id, [0, 0])
        total[0] += reserved
        total[1] += cost
    c = _starts(now)
    sql = (
        f"UPDATE {_table()} SET "
        f"spent_micros = {SPENT} + %(cost)s, "
        f"period_start = CASE WHEN period_start < {CURRENT} THEN {CURRENT} ELSE period_start END "
        f"WHERE id = %(budget_id)s"
    )
    out: list[Statement] = []
    for b in sorted(totals):
        # The charge locks the budget's row first, as a reservation does, before its lease is touched.
        out.append((sql, {**c, "cost": totals[b][1], "budget_id": b}))
        out.extend(leases.give_back_statements(b, totals[b][0]))
    return out


def releases(budget_ids: Iterable[int], micros: int) -> list[tuple[int, int, int]]:
    """The charges that give ``micros`` back on each budget and spend nothing (for ``settle``)."""
    return [(b, micros, 0) for b in budget_ids]


def settle(charges: Iterable[tuple[int, int, int]], now: datetime) -> None:
    """``settle_statements`` run here."""
    with connection.cursor() as cursor:
        for sql, params in settle_statements(charges, now):
            cursor.execute(sql, params)
