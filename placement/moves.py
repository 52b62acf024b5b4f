"""How fast replicas are moved off lost nodes: one setting, read in one place.

The reconciler's rate limiter and the what-if's estimate of how long the
moves take both read it here, so the estimate is made at the rate the moves
really run at.
"""

from __future__ import annotations

import os

from placement.scheduling.failures import MOVES_PER_MINUTE


def moves_per_minute() -> int:
    """Replicas moved off lost nodes in any minute, fleet-wide (``LLMGW_MOVES_PER_MINUTE``, 20; 0 stops them).

    Each move fetches a model's weights again and cold-starts an engine: 20 a
    minute moves a lost 18-tray rack's replicas in about a minute, and keeps a
    mistaken mass loss from starting thousands of downloads at once. A value
    that is not a whole number is read as the default.
    """
    try:
        return max(0, int(os.environ.get("LLMGW_MOVES_PER_MINUTE", MOVES_PER_MINUTE)))
    except ValueError:
        return MOVES_PER_MINUTE
