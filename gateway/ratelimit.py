"""Rate limits, requests and tokens per minute, per key and per team.

Shared by every gateway process: in Redis when LLMGW_REDIS_URL is set (one
Lua script per request, atomic), in the database otherwise, and in the
database too whenever Redis does not answer, so a Redis outage neither lets
everything through nor refuses everything.

The window slides: the count is this minute's plus the previous minute's
weighted by how much of it is still inside the last sixty seconds, which
avoids the double burst a fixed window allows at each minute's turn.

Tokens are held as budgets hold money: a request is let in when one more
request stays within ``rpm`` and the tokens counted plus the most it may use
(its prompt's bound and its completion bound, which the engine is held to:
gateway.tokens) stay within ``tpm``; those are counted at once, in this
minute's window, and when the request ends what it did not use is given back
in that same window (``TokensHeld``). Counted only when requests ended, a
burst was let in whole before the first of it had ended: 2,000 tokens a
minute allowed, 7,224 used in a second. A request whose bound alone is past
``tpm`` is refused saying so; it could never be let in.

What a process that dies holds is never given back: it slides out of the
window within two minutes, over-counting meanwhile, never under.
"""

from __future__ import annotations

import logging
import time

from django.db import transaction
from django.db.models import F
from django.db.models.functions import Greatest

from core import outage
from gateway.models import RateWindow
from gateway.rules import Caller, Limit, TokensHeld, limits

log = logging.getLogger("llmgw.gateway")
WINDOW_TTL_S = 150


def sliding(current: float, previous: float, fraction: float) -> float:
    """Count over the last sixty seconds, ``fraction`` of the way into this minute."""
    return current + previous * (1.0 - fraction)


def requests_reached(limit: Limit) -> str:
    return f"the {limit.label}'s limit of {limit.rpm} requests per minute is reached; retry in a few seconds"


def tokens_reached(limit: Limit) -> str:
    return f"the {limit.label}'s limit of {limit.tpm} tokens per minute is reached; retry in a few seconds"


def too_large(limit: Limit, asked: int) -> str:
    return (
        f"this request may use up to {asked} tokens (its prompt's bound and its max_tokens for each choice), "
        f"more than the {limit.label}'s limit of {limit.tpm} tokens per minute; send a lower max_tokens or a "
        "shorter prompt"
    )


def verdict(limit: Limit, requests: float, tokens: float, asked: int) -> str | None:
    """Why this limit refuses one more request that may use ``asked`` tokens, or None when it lets it in.

    The rule; ADMIT_LUA carries out the same in Redis, where it must be one atomic script.
    """
    if limit.rpm is not None and requests + 1 > limit.rpm:
        return requests_reached(limit)
    if limit.tpm is not None and asked > limit.tpm:
        return too_large(limit, asked)
    if limit.tpm is not None and tokens + asked > limit.tpm:
        return tokens_reached(limit)
    return None


def hold(checks: list[Limit], now: float, tokens: int, *, in_redis: bool) -> TokensHeld | None:
    """What a request let in at ``now`` holds on ``checks``; None when none has a tpm."""
    scopes = tuple(c.scope for c in checks if c.tpm is not None)
    if not scopes or tokens <= 0:
        return None
    return TokensHeld(scopes, _clock(now)[0], tokens, in_redis)


def _clock(now: float) -> tuple[int, float]:
    return int(now // 60), (now % 60) / 60.0


# --- the database -----------------------------------------------------------


def db_admit(checks: list[Limit], now: float, asked: int) -> str | None:
    """Let one request that may use ``asked`` tokens in on every limit, or say which refuses (counting nothing then).

    Counted: the request, and its tokens on each limit with a tpm (``hold`` says what it holds).
    """
    minute, fraction = _clock(now)
    with transaction.atomic():
        rows = {}
        for limit in sorted(checks, key=lambda c: c.scope):
            RateWindow.objects.get_or_create(scope=limit.scope, minute=minute)
            # Locked so that two processes checking the same scope take turns.
            found = RateWindow.objects.select_for_update().filter(scope=limit.scope, minute__in=(minute - 1, minute))
            windows = {w.minute: w for w in found}
            prev = windows.get(minute - 1)
            cur = windows[minute]
            requests = sliding(cur.requests, prev.requests if prev else 0, fraction)
            used = sliding(cur.tokens, prev.tokens if prev else 0, fraction)
            why = verdict(limit, requests, used, asked)
            if why:
                return why
            rows[limit.scope] = cur.pk
        RateWindow.objects.filter(pk__in=rows.values()).update(requests=F("requests") + 1)
        metered = [rows[c.scope] for c in checks if c.tpm is not None]
        if metered and asked > 0:
            RateWindow.objects.filter(pk__in=metered).update(tokens=F("tokens") + asked)
    return None


def db_settle(held: TokensHeld, used: int) -> None:
    """Count ``used`` where ``held`` was counted: what was held and not used is given back.

    A window pruned meanwhile (a request longer than two minutes) no longer counts anything.
    """
    change = used - held.tokens
    if change:
        found = RateWindow.objects.filter(scope__in=held.scopes, minute=held.minute)
        found.update(tokens=Greatest(F("tokens") + change, 0))


def db_prune(now: float) -> int:
    """Forget windows nothing will read again."""
    minute, _ = _clock(now)
    return RateWindow.objects.filter(minute__lt=minute - 2).delete()[0]


# --- Redis ------------------------------------------------------------------

# KEYS: per limit, 4 keys: this minute's requests, the previous minute's
# requests, this minute's tokens, the previous minute's tokens.
# ARGV: fraction, ttl, the tokens the request may use, then per limit rpm and
# tpm (-1: none). ``verdict``'s rule, carried out atomically: returns 0 when let
# in (the request counted, and its tokens on each limit with a tpm), else the
# 1-based index of the refusing limit times 10, plus 1 for requests or 2 for tokens.
ADMIT_LUA = """
local fraction = tonumber(ARGV[1])
local ttl = tonumber(ARGV[2])
local asked = tonumber(ARGV[3])
local n = #KEYS / 4
for i = 1, n do
  local base = (i - 1) * 4
  local rpm = tonumber(ARGV[3 + (i - 1) * 2 + 1])
  local tpm = tonumber(ARGV[3 + (i - 1) * 2 + 2])
  local req = tonumber(redis.call('GET', KEYS[base + 1]) or '0')
            + tonumber(redis.call('GET', KEYS[base + 2]) or '0') * (1 - fraction)
  if rpm >= 0 and req + 1 > rpm then return i * 10 + 1 end
  local tok = tonumber(redis.call('GET', KEYS[base + 3]) or '0')
            + tonumber(redis.call('GET', KEYS[base + 4]) or '0') * (1 - fraction)
  if tpm >= 0 and tok + asked > tpm then return i * 10 + 2 end
end
for i = 1, n do
  local base = (i - 1) * 4
  redis.call('INCR', KEYS[base + 1])
  redis.call('EXPIRE', KEYS[base + 1], ttl)
  if tonumber(ARGV[3 + (i - 1) * 2 + 2]) >= 0 and asked > 0 then
    redis.call('INCRBY', KEYS[base + 3], asked)
    redis.call('EXPIRE', KEYS[base + 3], ttl)
  end
end
return 0
"""
# KEYS: the token counts a request held; ARGV: what to add (negative: given back).
# A window that expired meanwhile (a request longer than WINDOW_TTL_S) is not made again.
SETTLE_LUA = """
for _, k in ipairs(KEYS) do
  if redis.call('EXISTS', k) == 1 then redis.call('INCRBY', k, ARGV[1]) end
end
return 0
"""


def _rkey(scope: str, minute: int, kind: str) -> str:
    return f"llmgw:rl:{scope}:{minute}:{kind}"


class Limiter:
    """Checks and counts rate limits for the gateway's requests.

    ``run_db`` runs a function on the gateway's database threads; ``redis``
    is a ``redis.asyncio`` client, or None for the database only.
    """

    def __init__(self, run_db, redis=None) -> None:
        self.run_db = run_db
        self.redis = redis
        self._script = redis.register_script(ADMIT_LUA) if redis is not None else None
        self._settle_script = redis.register_script(SETTLE_LUA) if redis is not None else None

    async def admit(self, caller: Caller, asked: int) -> tuple[str | None, TokensHeld | None]:
        """Let a request that may use ``asked`` tokens in: (why not, or None; the tokens it holds, to ``settle``)."""
        checks = limits(caller)
        if not checks:
            return None, None
        now = time.time()
        if self._script is not None:
            try:
                refused = await self._redis_admit(checks, now, asked)
            except Exception as exc:  # noqa: BLE001 - any Redis failure falls back to the database
                outage.redis.failed(exc)
            else:
                outage.redis.back()
                return refused, None if refused else hold(checks, now, asked, in_redis=True)
        refused = await self.run_db(db_admit, checks, now, asked)
        return refused, None if refused else hold(checks, now, asked, in_redis=False)

    async def _redis_admit(self, checks: list[Limit], now: float, asked: int) -> str | None:
        # What no count could let in (a request past a tpm on its own) costs no round trip.
        for c in checks:
            why = verdict(c, 0, 0, asked)
            if why:
                return why
        minute, fraction = _clock(now)
        keys: list[str] = []
        args: list = [fraction, WINDOW_TTL_S, asked]
        for c in checks:
            keys += [
                _rkey(c.scope, minute, "r"),
                _rkey(c.scope, minute - 1, "r"),
                _rkey(c.scope, minute, "t"),
                _rkey(c.scope, minute - 1, "t"),
            ]
            args += [-1 if c.rpm is None else c.rpm, -1 if c.tpm is None else c.tpm]
        code = int(await self._script(keys=keys, args=args))
        if code == 0:
            return None
        limit = checks[code // 10 - 1]
        return requests_reached(limit) if code % 10 == 1 else tokens_reached(limit)

    async def settle(self, held: TokensHeld | None, used: int) -> None:
        """A request that held ``held`` ended having used ``used`` tokens: what it did not use is given back.

        Where it was counted: a Redis that does not answer now keeps what it
        holds until the window slides out (over-counting for two minutes at
        most), rather than the database giving back what it never counted.
        """
        if held is None or used == held.tokens:
            return
        if not held.in_redis:
            await self.run_db(db_settle, held, used)
            return
        try:
            await self._settle_script(keys=[_rkey(s, held.minute, "t") for s in held.scopes], args=[used - held.tokens])
        except Exception as exc:  # noqa: BLE001 - left to slide out of the window, logged once per outage
            outage.redis.failed(exc)
