"""Which ready replica a request goes to. Pure: no framework, no I/O.

Without a prompt prefix the least loaded replica wins (fewest requests in
flight). With one, rendezvous hashing ranks the replicas for that prefix, so
every request sharing it lands on the same replica and finds its KV cache
warm; bounded load keeps that from piling up: a replica is passed over while
it holds more than ``load_factor`` times its fair share of the requests in
flight (Mirrokni et al., "Consistent Hashing with Bounded Loads"), and the
prefix's next-ranked replica takes the request. Some replica is always under
the bound, so a choice is always made.

Rendezvous rather than a ring: with the handful of replicas a model has, a
hash per replica costs nothing, needs no virtual nodes, and a replica going
away moves only the prefixes it held.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Collection, Mapping, Sequence


def score(prefix: str, replica: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{replica}\0{prefix}".encode(), digest_size=8).digest(), "big")


def bound(total_in_flight: int, replicas: int, load_factor: float) -> int:
    """Most requests one replica may hold, counting the one being placed."""
    return max(1, math.ceil(load_factor * (total_in_flight + 1) / replicas))


def choose(
    replicas: Sequence[str],
    in_flight: Mapping[str, int],
    prefix: str | None,
    *,
    load_factor: float = 1.25,
    exclude: Collection[str] = (),
    rng: random.Random | None = None,
) -> str | None:
    """The replica to try next; None when every one is excluded (already failed)."""
    candidates = [r for r in replicas if r not in exclude]
    if not candidates:
        return None
    if prefix:
        cap = bound(sum(in_flight.get(r, 0) for r in candidates), len(candidates), load_factor)
        for replica in sorted(candidates, key=lambda r: score(prefix, r), reverse=True):
            if in_flight.get(replica, 0) + 1 <= cap:
                return replica
    least = min(in_flight.get(r, 0) for r in candidates)
    tied = [r for r in candidates if in_flight.get(r, 0) == least]
    # Ties broken at random so idle replicas share the work instead of the
    # first in the list taking every request that arrives one at a time.
    return (rng or random).choice(tied)


def choose_preferring(
    replicas: Sequence[str],
    preferred: Collection[str],
    in_flight: Mapping[str, int],
    prefix: str | None,
    *,
    load_factor: float = 1.25,
    exclude: Collection[str] = (),
    rng: random.Random | None = None,
    then: Collection[str] = (),
) -> str | None:
    """:func:`choose` among the ``preferred`` replicas first (those holding a LoRA adapter), then among
    ``then`` (those holding it at a cost: llama.cpp's, which reload the model to switch to it), the rest
    once every one of those is excluded; None when all are."""
    kwargs = {"load_factor": load_factor, "exclude": exclude, "rng": rng}
    for tier in (preferred, then):
        chosen = choose([r for r in replicas if r in tier], in_flight, prefix, **kwargs)
        if chosen is not None:
            return chosen
    return choose(replicas, in_flight, prefix, **kwargs)


def prompt_prefix(body: Mapping, chars: int) -> str | None:
    """The leading ``chars`` characters of a request's prompt; None when it has none.

    Prompts shorter than that use all of themselves: their cache is small
    anyway. A conversation's turns share their first messages, so the turns
    of one conversation (longer than the prefix) go to one replica.
    """
    if chars <= 0:
        return None
    messages = body.get("messages")
    if isinstance(messages, list):
        parts: list[str] = []
        size = 0
        for message in messages:
            if not isinstance(message, dict):
                continue
            content = message.get("content")
            if isinstance(content, list):
                content = "".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
            text = f"{message.get('role', '')}:{content if isinstance(content, str) else ''}\n"
            parts.append(text)
            size += len(text)
            if size >= chars:
                break
        joined = "".join(parts)
        return joined[:chars] or None
    prompt = body.get("prompt")
    if isinstance(prompt, list):
        prompt = prompt[0] if prompt and isinstance(prompt[0], str) else None
    if isinstance(prompt, str) and prompt:
        return prompt[:chars]
    return None
