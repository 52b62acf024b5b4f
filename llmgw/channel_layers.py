"""The channel layer the console's live pages ride on, in each mode.

With Redis, every process of every control host reaches every page. Without
it (embedded defaults), the in-memory layer reaches only this process, which
is why the embedded worker runs inside the ASGI process (see llmgw.serve).
"""

from __future__ import annotations

# channels_redis waits for a page's next message with a BRPOP of 5 s (its
# ``brpop_timeout``), and since redis-py 8 every connection has a 5 s socket
# timeout by default: a page that heard nothing for 5 s raced Redis's empty
# answer against its own read timeout, lost about half the time, and was
# closed (4503) and reconnected — missing what was sent meanwhile. The read
# timeout must outlast the blocking read; a Redis that stops answering is
# still noticed, a few seconds later.
BLOCKING_READ_S = 5.0
READ_TIMEOUT_S = BLOCKING_READ_S + 5.0
CONNECT_TIMEOUT_S = 2.0


def redis_layer(url: str, *, capacity: int = 1000, expiry: int = 10) -> dict:
    """CHANNEL_LAYERS for Redis at ``url``: a page's channel holds ``capacity`` messages for ``expiry`` s."""
    return {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {
                "hosts": [
                    {
                        "address": url,
                        "socket_timeout": READ_TIMEOUT_S,
                        "socket_connect_timeout": CONNECT_TIMEOUT_S,
                    }
                ],
                "capacity": capacity,
                "expiry": expiry,
            },
        }
    }


def in_memory_layer() -> dict:
    return {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
