"""Rate limits, requests and tokens per minute, per key and per team.

Shared by every gateway process: in Redis when LLMGW_REDIS_URL is set (one
Lua script per request, atomic), in the database otherwise, and in the
database too whenever Redis does not answer, so a Redis outage neither lets
everything through nor refuses everything.

The window slides: the count is this minute's plus the previous minute's
weighted by how much of it is still inside the last sixty seconds, which
avoids the double burst a fixed window allows at each minute's turn. A
request is let in when one more request stays within ``rpm`` and the tokens
already used stay below ``tpm``; its own tokens are only known when it ends
and are counted then.
"""

from __future__ import annotations

import logging
import time

from django.db import transaction
from django.db.models import F

from core import outage
from gateway.models import RateWindow
from gateway.rules import Caller, Limit, limits

log = logging.getLogger("llmgw.gateway")
WINDOW_TTL_S = 150


def sliding(current: float, previous: float, fraction: float) -> float:
    """Count over the last sixty seconds, ``fraction`` of the way into this minute."""
    return current + previous * (1.0 - fraction)


def requests_reached(limit: Limit) -> str:
    return f"the {limit.label}'s limit of {limit.rpm} requests per minute is reached; retry in a few seconds"


def tokens_reached(limit: Limit) -> str:
    return f"the {limit.label}'s limit of {limit.tpm} tokens per minute is reached; retry in a few seconds"


def verdict(limit: Limit, requests: float, tokens: float) -> str | None:
    """Why this limit refuses one more request, or None when it lets it in."""
    if limit.rpm is not None and requests + 1 > limit.rpm:
        return requests_reached(limit)
    if limit.tpm is not None and tokens >= limit.tpm:
        return tokens_reached(limit)
    return None


def _clock(now: float) -> tuple[int, float]:
    return int(now // 60), (now % 60) / 60.0


# --- the database -----------------------------------------------------------


def db_admit(checks: list[Limit], now: float) -> str | None:
    """Let one request in on every limit, or say which refuses (counting nothing then)."""
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
            tokens = sliding(cur.tokens, prev.tokens if prev else 0, fraction)
            why = verdict(limit, requests, tokens)
            if why:
                return why
            rows[limit.scope] = cur.pk
        RateWindow.objects.filter(pk__in=rows.values()).update(requests=F("requests") + 1)
    return None


def db_spend(scopes: list[str], tokens: int, now: float) -> None:
    minute, _ = _clock(now)
    for scope in scopes:
        window, _ = RateWindow.objects.get_or_create(scope=scope, minute=minute)
        RateWindow.objects.filter(pk=window.pk).update(tokens=F("tokens") + tokens)


def db_prune(now: float) -> int:
    """Forget windows nothing will read again."""
    minute, _ = _clock(now)
    return RateWindow.objects.filter(minute__lt=minute - 2).delete()[0]


# --- Redis ------------------------------------------------------------------

# KEYS: per limit, 4 keys: this minute's requests, the previous minute's
# requests, this minute's tokens, the previous minute's tokens.
# ARGV: fraction, ttl, then per limit rpm and tpm (-1: none).
# Returns 0 when let in (and counts the request), else the 1-based index of
# the refusing limit times 10, plus 1 for requests or 2 for tokens.
ADMIT_LUA = """
local fraction = tonumber(ARGV[1])
local ttl = tonumber(ARGV[2])
local n = #KEYS / 4
for i = 1, n do
  local base = (i - 1) * 4
  local rpm = tonumber(ARGV[2 + (i - 1) * 2 + 1])
  local tpm = tonumber(ARGV[2 + (i - 1) * 2 + 2])
  local req = tonumber(redis.call('GET', KEYS[base + 1]) or '0')
            + tonumber(redis.call('GET', KEYS[base + 2]) or '0') * (1 - fraction)
  if rpm >= 0 and req + 1 > rpm then return i * 10 + 1 end
  local tok = tonumber(redis.call('GET', KEYS[base + 3]) or '0')
            + tonumber(redis.call('GET', KEYS[base + 4]) or '0') * (1 - fraction)
  if tpm >= 0 and tok >= tpm then return i * 10 + 2 end
end
for i = 1, n do
  local k = KEYS[(i - 1) * 4 + 1]
  redis.call('INCR', k)
  redis.call('EXPIRE', k, ttl)
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

    async def admit(self, caller: Caller) -> str | None:
        checks = limits(caller)
        if not checks:
            return None
        now = time.time()
        if self._script is not None:
            try:
                refused = await self._redis_admit(checks, now)
            except Exception as exc:  # noqa: BLE001 - any Redis failure falls back to the database
                outage.redis.failed(exc)
            else:
                outage.redis.back()
                return refused
        return await self.run_db(db_admit, checks, now)

    async def _redis_admit(self, checks: list[Limit], now: float) -> str | None:
        minute, fraction = _clock(now)
        keys: list[str] = []
        args: list = [fraction, WINDOW_TTL_S]
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

    async def spend(self, caller: Caller, tokens: int) -> None:
        """Count a finished request's tokens against the limits that have a tpm."""
        scopes = [c.scope for c in limits(caller) if c.tpm is not None]
        if not scopes or tokens <= 0:
            return
        now = time.time()
        if self.redis is not None:
            try:
                minute, _ = _clock(now)
                async with self.redis.pipeline(transaction=False) as pipe:
                    for scope in scopes:
                        pipe.incrby(_rkey(scope, minute, "t"), tokens)
                        pipe.expire(_rkey(scope, minute, "t"), WINDOW_TTL_S)
                    await pipe.execute()
                return
            except Exception as exc:  # noqa: BLE001 - counted in the database instead
                outage.redis.failed(exc)
        await self.run_db(db_spend, scopes, tokens, now)
