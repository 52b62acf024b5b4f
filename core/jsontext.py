"""Compact JSON text for the hot paths that write a body or a batch a heartbeat.

orjson takes a fifth of json's time, but refuses an int past 64 bits and a
key that is not a string; json writes those, so the text of any value json
can write is still written. Neither side's whitespace matters to the readers
here (agents, PostgreSQL's jsonb).

Not for texts that must equal json's byte for byte (the report digest,
agent.protocol) or DRF's (api.base.dumps): those hold their own fallbacks,
each tested against the encoder it stands in for.
"""

from __future__ import annotations

import json
from typing import Any

import orjson


def compact(value: Any) -> bytes:
    """``value`` as compact JSON bytes, by orjson where it can, else by json.

    NaN and infinity come out as ``null`` by orjson (json would write
    ``NaN``, which no strict reader takes): callers hand in values their
    checks have already found finite.
    """
    try:
        return orjson.dumps(value)
    except TypeError:  # orjson.JSONEncodeError is one: an int past 64 bits, a key that is not a string
        return json.dumps(value, separators=(",", ":")).encode()
