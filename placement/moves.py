"""How fast replicas are moved off lost nodes: one setting, read in one place.

The reconciler's rate limiter and the what-if's estimate of how long the
moves take both read it here, so the estimate is made at the rate the moves
really run at.
"""

from __future__ import annotations

import os

MOVES_PER_MINUTE_DEFAULT = 10


def moves_per_minute() -> int:
    """Replica moves started per minute fleet-wide (``LLMGW_MOVES_PER_MINUTE``, default 10; at least 1).

    Ten a minute is of the order of Kubernetes' default node eviction rate
    (0.1 nodes a second): a rack's worth of replicas moves in minutes, not
    all in the same second onto whatever happens to be free then.
    """
    try:
        return max(1, int(os.environ.get("LLMGW_MOVES_PER_MINUTE", MOVES_PER_MINUTE_DEFAULT)))
    except ValueError:
        return MOVES_PER_MINUTE_DEFAULT
