"""Every leaf of each ``/v1`` body the gateway takes (chat, completions, embeddings), mutated.

The key may use ``hostile-chat`` only, whose replica is a fake engine that
refuses what a real one would. After each mutant every reservation must be
back (a refused or failed request holds nothing), and a refusal changes
nothing stored but the usage it records by design.
"""

from __future__ import annotations

import time

import httpx
import pytest

from tests.hostile import mutants as M
from tests.hostile.fleet import SETTLE_TIMEOUT_S, Hostile
from tests.hostile.live import USAGE_TABLES
from tests.hostile.probe import dumps, tally

pytestmark = [pytest.mark.slow, pytest.mark.hostile]

MODEL = "hostile-chat"
CHAT = {
    "model": MODEL,
    "messages": [
        {"role": "system", "content": "Answer in one word."},
        {"role": "user", "content": [{"type": "text", "text": "hello there"}]},
    ],
    "max_tokens": 8,
    "temperature": 0.2,
    "top_p": 0.9,
    "n": 1,
    "stop": ["\n\n"],
    "stream": False,
    "user": "hostile",
    "tools": [
        {
            "type": "function",
            "function": {
                "name": "lookup",
                "description": "Look a word up",
                "parameters": {"type": "object", "properties": {"word": {"type": "string"}}},
            },
        }
    ],
}
# Streaming: only what changes how the answer is relayed and counted is walked again.
CHAT_STREAM = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "hello there"}],
    "max_tokens": 8,
    "stream": True,
    "stream_options": {"include_usage": True},
}
COMPLETION = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 8, "temperature": 0.5, "echo": False}
EMBEDDING = {"model": MODEL, "input": ["first text", "second text"], "encoding_format": "float"}
BASES = [
    ("chat", "/v1/chat/completions", CHAT),
    ("chat stream", "/v1/chat/completions", CHAT_STREAM),
    ("completions", "/v1/completions", COMPLETION),
    ("embeddings", "/v1/embeddings", EMBEDDING),
]
# Another model the fleet serves, which this key may not use.
FOREIGN = {"model": "hostile-fleet"}


def reservations_back(h: Hostile) -> str | None:
    """Wait until no budget holds a reservation; None, or what is still held."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    held = None
    while time.monotonic() < deadline:
        held = h.store.value("SELECT coalesce(sum(reserved_micros), 0) FROM gateway_budget")
        if not held:
            return None
        time.sleep(0.01)
    return f"{held} micros were still reserved {SETTLE_TIMEOUT_S:.0f} s later"


def test_every_leaf_of_every_v1_body(hostile: Hostile):
    h, t = hostile, tally("gateway")
    auth = {"Authorization": f"Bearer {h.ids['gateway_key']}", "content-type": "application/json"}
    for label, path, base in BASES:
        cases = [M.Case((), M.Mutant("(unchanged)", base), base)]
        cases += M.cases(base, foreign=FOREIGN)
        for case in cases:

            def request(doc=case.doc, path=path) -> httpx.Response:
                return h.gateway.post(path, content=dumps(doc), headers=auth)

            answer = h.prober.send(
                t,
                f"{label} {case.where}",
                str(case.mutant),
                request,
                settle=lambda answer: reservations_back(h),
                skip=USAGE_TABLES,
            )
            if not case.path and (answer is None or not answer.is_success):
                got = "no answer" if answer is None else f"{answer.status_code} {answer.text[:300]}"
                t.fail(f"gateway: the {label} base request itself was not served: {got}")
    assert t.verdict() is None, t.verdict()
