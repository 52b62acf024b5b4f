"""The gateway's knobs, read from the environment once per process.

Every one has a default that works on one machine. A value that is set but
unusable raises ``core.config.ConfigError`` naming the variable, like the
rest of llmgw's configuration.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cache

from core.config import number


@dataclass(frozen=True)
class GatewayConf:
    cold_start_timeout_s: float
    """How long a request for a model scaled to zero waits for its first replica."""
    cold_keepalive_s: float
    cold_wait_per_key: int
    """The most requests one key may hold waiting for a cold start (gateway.coldwait.Waiters); more get 429."""
    cold_wait_per_team: int
    """The same bound over every key of one team."""
    """How often a streaming request waiting for a cold start gets an SSE comment (the first after as long)."""
    max_body_bytes: int
    """Larger request bodies are refused with 413 before anything else is done."""
    upstream_connect_timeout_s: float
    upstream_read_timeout_s: float
    """Silence from an engine this long, mid-answer, ends the request."""
    refresh_s: float
    """How stale the cached catalog and replica list may get before a request refreshes it."""
    affinity_prefix_chars: int
    """Requests whose prompts share this many leading characters go to the same replica."""
    load_factor: float
    """Bounded-load factor: a replica is skipped by affinity when above this multiple of the mean load."""
    default_completion_tokens: int
    """The length of a request that sets none: reserved on budgets and tpm, and sent to the engine as its bound."""
    db_threads: int
    """Threads the gateway's ORM work runs on (each holds one connection), and on PostgreSQL the
    most connections the request path's statements use from the event loop (gateway.pgpath)."""
    touch_every_s: float
    """How often the last-use times of replicas are handed to placement."""
    flush_every_s: float
    """How often usage records are written (in one transaction per flush)."""
    lease_s: float
    """How long a gateway process's reservations outlive its last renewal (gateway.writes.leases); renewed
    four times per lease while the process lives."""


def _number(env: dict[str, str], name: str, default: float, *, minimum: float = 0.0) -> float:
    return number(env, name, default, low=minimum)


def load(env: dict[str, str] | None = None) -> GatewayConf:
    env = dict(os.environ if env is None else env)
    return GatewayConf(
        cold_start_timeout_s=_number(env, "LLMGW_COLD_START_TIMEOUT_S", 300.0),
        cold_keepalive_s=_number(env, "LLMGW_COLD_KEEPALIVE_S", 5.0, minimum=0.05),
        cold_wait_per_key=int(_number(env, "LLMGW_COLD_WAIT_PER_KEY", 4, minimum=1)),
        cold_wait_per_team=int(_number(env, "LLMGW_COLD_WAIT_PER_TEAM", 16, minimum=1)),
        max_body_bytes=int(_number(env, "LLMGW_GATEWAY_MAX_BODY_BYTES", 8 * 1024 * 1024, minimum=1024)),
        upstream_connect_timeout_s=_number(env, "LLMGW_UPSTREAM_CONNECT_TIMEOUT_S", 5.0, minimum=0.1),
        upstream_read_timeout_s=_number(env, "LLMGW_UPSTREAM_READ_TIMEOUT_S", 600.0, minimum=1.0),
        refresh_s=_number(env, "LLMGW_GATEWAY_REFRESH_S", 1.0, minimum=0.05),
        affinity_prefix_chars=int(_number(env, "LLMGW_AFFINITY_PREFIX_CHARS", 256, minimum=0)),
        load_factor=_number(env, "LLMGW_AFFINITY_LOAD_FACTOR", 1.25, minimum=1.0),
        default_completion_tokens=int(_number(env, "LLMGW_BUDGET_DEFAULT_COMPLETION_TOKENS", 1024, minimum=1)),
        db_threads=int(_number(env, "LLMGW_GATEWAY_DB_THREADS", 8, minimum=1)),
        touch_every_s=_number(env, "LLMGW_GATEWAY_TOUCH_EVERY_S", 5.0, minimum=0.1),
        flush_every_s=_number(env, "LLMGW_GATEWAY_FLUSH_EVERY_S", 0.05, minimum=0.001),
        lease_s=_number(env, "LLMGW_GATEWAY_LEASE_S", 120.0, minimum=1.0),
    )


@cache
def get() -> GatewayConf:
    return load()
