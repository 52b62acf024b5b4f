"""Letting a request in: key, model allowed, rate limits (database mode), budgets.

One function, run on a database thread, so the common request costs one hop
off the event loop: the key and the budgets over it come in one query, and
a reservation is one conditional UPDATE per budget.

What is decided (which model a key may use, what a request reserves, the
refusal) is written once, in gateway.rules, and carried out here with the
ORM and in gateway.pgpath from the event loop.

The rule admission holds: the model that finally serves a request was
allowed for the key, and its cost was reserved within every budget above the
key before the first byte went to its engine — for a model asked by its
name, by an alias, and for every hop of its fallback chain. ``admit`` holds
it for the model asked for; each fallback hop is admitted again before its
engine is asked (``rules.hop_allowed``, then ``readmit``), moving the reservation
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

import dataclasses
import time
from datetime import datetime

from gateway import errors, ratelimit, rules
from gateway.rules import Admission, Ask
from gateway.writes import budgets
from gateway.writes.keys import Caller, authenticate


def admit(secret: str, ask: Ask) -> Admission:
    """Check the key, the model, the limits and the budgets, reserving on the budgets.

    ``ask.db_limits`` False leaves rate limits to Redis (checked by the caller).
    A refusal after the key is known keeps the caller, so it is recorded.
    """
    caller, why = authenticate(secret)
    if caller is None:
        return Admission(None, errors.unauthorized(why))
    return admit_caller(caller, ask)


def admit_caller(caller: Caller, ask: Ask) -> Admission:
    """``admit`` for a caller already authenticated: ``rules.decide``, carried out with the ORM."""
    decision = rules.decide(caller, ask)
    refused = decision.refusal()
    if refused is not None:
        return refused
    held = None
    if decision.count_limits:
        checks, now = ratelimit.limits(caller), time.time()
        why = ratelimit.db_admit(checks, now, ask.tokens)
        if why:
            return Admission(caller, errors.rate_limited(why))
        held = ratelimit.hold(checks, now, ask.tokens, in_redis=False)
    refusal = budgets.reserve(list(decision.reserve), decision.estimate, ask.now)
    if refusal is not None:
        # Recorded as refused, which gives the tokens held back.
        return Admission(caller, errors.over_budget(refusal.sentence), tokens_held=held)
    return dataclasses.replace(decision.admitted(), tokens_held=held)


def readmit(caller: Caller, held: int, estimate: int | None, now: datetime) -> tuple[int, errors.Refused | None]:
    """Move this request's reservation to a hop's ``estimate``: what is held now, and the refusal if any.

    More is reserved with the same conditional UPDATE as ``admit`` (all
    budgets or none, so a refused hop holds what it held before); less is
    given back at once, so the reservation is what the hop can cost.
    """
    if not caller.budget_ids:
        return 0, None
    change = rules.adjustment(held, estimate)
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
