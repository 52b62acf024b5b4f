"""Who is let in, for which model, holding what: the admission rules, pure, that both admission paths carry out.

A request is admitted one of two ways: with the ORM on the gateway's
threads (gateway.admission), or from the event loop on PostgreSQL
(gateway.pgpath). They must decide alike, and the tests compare them answer
for answer; so what they decide is written here once, and they differ only
in how they talk to the database:

- A key may use a model asked by its name or an alias (``allowed``); a
  fallback hop is asked by its catalog name (``hop_allowed``). Otherwise the
  answer is a 403 naming the model asked for (``decide``).
- Rate limits are counted in the database when the gateway counts them
  there (no Redis) and the key or its team sets one (``limits``).
- A priced model reserves its largest cost on every budget above the key,
  all or none; a model with no price, or a key with no budget, reserves
  nothing (``decide``, ``Decision.admitted``).
- A fallback hop moves the reservation to its own price (``adjustment``).
- A request holds its largest token count on the ``tpm`` limits over its key
  from admission until it ends (``TokensHeld``; gateway.ratelimit counts it).

Pure: no Django, no I/O (a contract in pyproject.toml holds it).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from gateway import errors


@dataclass(frozen=True)
class Caller:
    """Who a request comes from, as the gateway needs it on every request."""

    key_id: str
    team_id: int
    org_id: int
    allowed_models: tuple[str, ...] | None
    key_rpm: int | None
    key_tpm: int | None
    team_rpm: int | None
    team_tpm: int | None
    budget_ids: tuple[int, ...] = ()
    """The budgets over this key: its own, its team's, its organisation's, where set."""


@dataclass(frozen=True)
class Limit:
    scope: str
    """``key:<id>`` or ``team:<id>``."""
    label: str
    """How the refusal names it: "key", "team"."""
    rpm: int | None
    tpm: int | None


def limits(caller: Caller) -> list[Limit]:
    """The limits over a caller; empty when neither its key nor its team sets one."""
    out = []
    if caller.key_rpm is not None or caller.key_tpm is not None:
        out.append(Limit(f"key:{caller.key_id}", "key", caller.key_rpm, caller.key_tpm))
    if caller.team_rpm is not None or caller.team_tpm is not None:
        out.append(Limit(f"team:{caller.team_id}", "team", caller.team_rpm, caller.team_tpm))
    return out


@dataclass(frozen=True)
class Ask:
    """What a request asks to be let in for, and on what terms."""

    requested: str
    """The name the client asked for: the model's own, or an alias."""
    canonical: str
    """The model's catalog name."""
    aliases: tuple[str, ...]
    estimate: int | None
    """Its largest cost in micros at the model's price; None: the model has no price, so no budget applies."""
    db_limits: bool
    """Whether rate limits are counted in the database (else in Redis, by the caller)."""
    now: datetime
    tokens: int = 0
    """The most tokens the request may use (its prompt's bound and its completion bound): what it holds on
    the ``tpm`` limits over its key until it ends."""

    @property
    def names(self) -> list[str]:
        """Every name the model is asked by, as the key's model list may name it."""
        return [self.requested, self.canonical, *self.aliases]


@dataclass(frozen=True)
class TokensHeld:
    """Tokens a request holds on the ``tpm`` limits over its key, from admission until it ends.

    Held as a budget holds micros: counted in the window of the minute the
    request was let in, so a burst cannot all be let in before the first of
    it has ended, and settled there when it ends (what was not used given back).
    """

    scopes: tuple[str, ...]
    """The limits that have a ``tpm`` (``Limit.scope``)."""
    minute: int
    """The window they were counted in, settled there whenever the request ends."""
    tokens: int
    in_redis: bool
    """Counted in Redis, else in the database: settled where they were counted."""


@dataclass(frozen=True)
class Admission:
    caller: Caller | None
    refused: errors.Refused | None = None
    reserved: tuple[tuple[int, int], ...] = ()
    """(budget id, micros) reserved for this request, to be taken back when it ends."""
    tokens_held: TokensHeld | None = None
    """Tokens held on the rate limits counted in the database, to be settled when it ends."""


def allowed(caller: Caller, requested: str, canonical: str, aliases: tuple[str, ...] = ()) -> bool:
    """Whether the key may use a model under any of its names."""
    if caller.allowed_models is None:
        return True
    names = set(caller.allowed_models)
    return requested in names or canonical in names or any(a in names for a in aliases)


def hop_allowed(caller: Caller, name: str, aliases: tuple[str, ...]) -> bool:
    """Whether a fallback hop (reached by its catalog name) may serve this key's request."""
    return allowed(caller, name, name, aliases)


def reservation(budget_ids: tuple[int, ...], micros: int) -> tuple[tuple[int, int], ...]:
    """``micros`` held on each of ``budget_ids``, as ``Admission.reserved`` records it."""
    return tuple((b, micros) for b in budget_ids)


@dataclass(frozen=True)
class Decision:
    """What letting a known key in takes: a refusal now, or the limits to count and the budgets to reserve on."""

    caller: Caller
    refused: errors.Refused | None = None
    count_limits: bool = False
    """Rate limits counted in the database must let it in first."""
    reserve: tuple[int, ...] = ()
    """The budgets to reserve ``estimate`` on, all or none; empty: nothing to reserve."""
    estimate: int = 0

    def refusal(self) -> Admission | None:
        """The answer when the key is refused before anything is counted or reserved."""
        return Admission(self.caller, self.refused) if self.refused is not None else None

    def admitted(self) -> Admission:
        """The answer once the limits let it in and ``reserve`` is reserved."""
        return Admission(self.caller, reserved=reservation(self.reserve, self.estimate))


def decide(caller: Caller, ask: Ask) -> Decision:
    """The one decision for a known key, which each path carries out against its database."""
    if not allowed(caller, ask.requested, ask.canonical, ask.aliases):
        return Decision(caller, errors.not_allowed(ask.requested))
    count_limits = ask.db_limits and bool(limits(caller))
    if ask.estimate is None:
        return Decision(caller, count_limits=count_limits)
    return Decision(caller, count_limits=count_limits, reserve=caller.budget_ids, estimate=ask.estimate)


def adjustment(held: int, estimate: int | None) -> int:
    """Micros to add (positive) or give back (negative) on each budget, holding ``held``, to cover ``estimate``.

    ``estimate`` None is a model with no price: nothing needs holding.
    """
    return (estimate or 0) - held
