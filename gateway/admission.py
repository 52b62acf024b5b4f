"""Letting a request in: key, model allowed, rate limits (database mode), budgets.

One function, run on a database thread, so the common request costs one hop
off the event loop: the key and the budgets over it come in one query, and
a reservation is one conditional UPDATE per budget.

The rule admission holds: the model that finally serves a request was
allowed for the key, and its cost was reserved within every budget above the
key before the first byte went to its engine — for a model asked by its
name, by an alias, and for every hop of its fallback chain. ``admit`` holds
it for the model asked for; each fallback hop is admitted again before its
engine is asked (``hop_allowed``, then ``readmit``), moving the reservation
from the previous hop's price to this one's.

Re-admitted per hop rather than reserved once at the dearest model of the
chain: the reservation is then the cost of the model actually used, not of
one a request almost never reaches (fallbacks are for outages), so a budget
near its end is not refused for a price nobody pays; and a fallback costs a
round trip only when it is used and priced differently. The key's model
list is checked per hop either way; a hop it does not allow is skipped,
never named to the client.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime

from gateway import budgets, errors, ratelimit
from gateway.keys import Caller, authenticate


def allowed(caller: Caller, requested: str, canonical: str, aliases: tuple[str, ...] = ()) -> bool:
    """Whether the key may use a model under any of its names."""
    if caller.allowed_models is None:
        return True
    names = set(caller.allowed_models)
    return requested in names or canonical in names or any(a in names for a in aliases)


@dataclass(frozen=True)
class Admission:
    caller: Caller | None
    refused: errors.Refused | None = None
    reserved: tuple[tuple[int, int], ...] = ()
    """(budget id, micros) reserved for this request, to be taken back when it ends."""


def admit(
    secret: str,
    requested: str,
    canonical: str,
    aliases: tuple[str, ...],
    estimate: int | None,
    db_limits: bool,
    now: datetime,
) -> Admission:
    """Check the key, the model, the limits and the budgets, reserving on the budgets.

    ``estimate`` None means the model has no price: no budget applies.
    ``db_limits`` False leaves rate limits to Redis (checked by the caller).
    A refusal after the key is known keeps the caller, so it is recorded.
    """
    caller, why = authenticate(secret)
    if caller is None:
        return Admission(None, errors.unauthorized(why))
    return admit_caller(caller, requested, canonical, aliases, estimate, db_limits, now)


def screen(caller: Caller, requested: str, canonical: str, aliases: tuple[str, ...]) -> Admission | None:
    """The refusal of a known key for a model it may not use; None when it may."""
    if not allowed(caller, requested, canonical, aliases):
        return Admission(caller, errors.not_allowed(requested))
    return None


def admit_caller(
    caller: Caller,
    requested: str,
    canonical: str,
    aliases: tuple[str, ...],
    estimate: int | None,
    db_limits: bool,
    now: datetime,
) -> Admission:
    """``admit`` for a caller already authenticated."""
    refused = screen(caller, requested, canonical, aliases)
    if refused is not None:
        return refused
    if db_limits:
        checks = ratelimit.limits(caller)
        if checks:
            why = ratelimit.db_admit(checks, time.time())
            if why:
                return Admission(caller, errors.rate_limited(why))
    if estimate is None or not caller.budget_ids:
        return Admission(caller)
    refusal = budgets.reserve(list(caller.budget_ids), estimate, now)
    if refusal is not None:
        return Admission(caller, errors.over_budget(refusal.sentence))
    return Admission(caller, reserved=tuple((b, estimate) for b in caller.budget_ids))


def hop_allowed(caller: Caller, name: str, aliases: tuple[str, ...]) -> bool:
    """Whether a fallback hop (reached by its catalog name) may serve this key's request."""
    return allowed(caller, name, name, aliases)


def adjustment(held: int, estimate: int | None) -> int:
    """Micros to add (positive) or give back (negative) on each budget, holding ``held``, to cover ``estimate``.

    ``estimate`` None is a model with no price: nothing needs holding.
    """
    return (estimate or 0) - held


def readmit(caller: Caller, held: int, estimate: int | None, now: datetime) -> tuple[int, errors.Refused | None]:
    """Move this request's reservation to a hop's ``estimate``: what is held now, and the refusal if any.

    More is reserved with the same conditional UPDATE as ``admit`` (all
    budgets or none, so a refused hop holds what it held before); less is
    given back at once, so the reservation is what the hop can cost.
    """
    if not caller.budget_ids:
        return 0, None
    change = adjustment(held, estimate)
    if change > 0:
        refusal = budgets.reserve(list(caller.budget_ids), change, now)
        if refusal is not None:
            return held, errors.over_budget(refusal.sentence)
    elif change < 0:
        budgets.settle(budgets.releases(caller.budget_ids, -change), now)
    return held + change, None


def over_budget(caller: Caller, budget_ids: list[int], estimate: int, now: datetime) -> Admission:
    """The refusal, in words, of a request that one of ``budget_ids`` could not take."""
    return Admission(caller, errors.over_budget(budgets.explain_refusal(budget_ids, estimate, now).sentence))


def authenticate_only(secret: str) -> Admission:
    caller, why = authenticate(secret)
    return Admission(caller, None if caller else errors.unauthorized(why))
