"""Sending one mutant and judging the answer: the suite's rules, in one place.

For every mutant:

1. the answer is not 5xx, and the server still answers ``/healthz`` on both
   listeners;
2. the server logged no traceback for it;
3. a 4xx carries a sentence (``error``, ``error.message``, ``detail`` or ``message``);
4. a 4xx changed nothing stored (the tables of ``live.TABLES``); a 5xx that did is told too;
5. on agent endpoints, node B's rows are as they were, whatever the answer.

Failures are collected, not raised: each surface fails once, at its end, with
the whole list, since the suite is run to see what is left to fix.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import httpx

from tests.hostile.live import Serve, Snapshot, Store

MAX_LISTED = 300


@dataclass
class Tally:
    """What one surface's mutants got, for the terminal summary and the surface's single failure."""

    surface: str
    sent: int = 0
    ok: int = 0
    refused: int = 0
    errors: int = 0
    other: int = 0
    changes: int = 0
    tracebacks: int = 0
    failures: list[str] = field(default_factory=list)

    def line(self) -> str:
        return (
            f"hostile: {self.surface} {self.sent:,} mutants: {self.refused:,} 4xx, {self.ok:,} 2xx, "
            f"{self.errors:,} 5xx, {self.changes:,} state changes, {self.tracebacks:,} logged tracebacks"
            + (f", {self.other:,} other" if self.other else "")
        )

    def fail(self, message: str) -> None:
        self.failures.append(message)

    def verdict(self) -> str | None:
        """None when every mutant was answered well; else the summary line and every failure."""
        if not self.failures:
            return None
        listed = self.failures[:MAX_LISTED]
        more = len(self.failures) - len(listed)
        return "\n".join([self.line(), *listed, *([f"… and {more} more"] if more else [])])


TALLIES: dict[str, Tally] = {}


def tally(surface: str) -> Tally:
    TALLIES[surface] = TALLIES.get(surface) or Tally(surface)
    return TALLIES[surface]


def sentence(answer: httpx.Response) -> str | None:
    """The refusal's sentence: ``{"error": "..."}``, ``{"error": {"message": "..."}}``, ``detail`` or ``message``."""
    try:
        body = answer.json()
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(body, dict):
        return None
    error = body.get("error")
    nested = error.get("message") if isinstance(error, dict) else None
    # The engines' own refusals, which the gateway relays, put it at the top: {"object": "error", "message": ...}.
    for candidate in (error, nested, body.get("detail"), body.get("message")):
        if isinstance(candidate, str) and candidate.strip():
            return candidate
    return None


def brief(answer: httpx.Response, limit: int = 160) -> str:
    if "html" in answer.headers.get("content-type", ""):
        return "(an HTML error page)"
    text = answer.text.replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 1] + "…"


class ServerGone(AssertionError):
    """The server stopped answering: nothing after this mutant could be judged."""


@dataclass
class Owned:
    """Node B: its id and name, and its rows as they must stay."""

    node_id: int
    name: str
    rows: Snapshot


class Prober:
    """Sends mutants to one live server and judges each answer (see the module's rules)."""

    def __init__(self, serve: Serve, store: Store) -> None:
        self.serve = serve
        self.store = store
        self.last: tuple[frozenset[str], Snapshot] | None = None

    def snapshot(self, skip: frozenset[str]) -> Snapshot:
        if self.last is not None and self.last[0] == skip:
            return self.last[1]
        return self.store.snapshot(skip)

    def forget(self) -> None:
        """Something outside a probe changed the store: the next snapshot is read afresh."""
        self.last = None

    def send(
        self,
        t: Tally,
        where: str,
        mutant: str,
        request: Callable[[], httpx.Response],
        *,
        settle: Callable[[httpx.Response], str | None] | None = None,
        owned: Owned | None = None,
        skip: Iterable[str] = (),
    ) -> httpx.Response | None:
        """Send one mutant; count and judge its answer. ``settle`` waits for what the answer queued."""
        skip = frozenset(skip)
        label = f"{t.surface}: {where} ← {mutant}"
        before = self.snapshot(skip)
        self.serve.log.new()
        t.sent += 1
        try:
            answer = request()
        except httpx.TransportError as exc:
            t.errors += 1
            self.last = None
            t.fail(f"{label}: no answer ({type(exc).__name__}: {exc}){self._tracebacks(t)}")
            self._still_up(t, label)
            return None
        late = settle(answer) if settle else None
        if late:
            t.fail(f"{label}: {answer.status_code}, then {late}")
        logged = self._tracebacks(t)
        status = answer.status_code
        if status >= 500:
            t.errors += 1
            after = self.store.snapshot(skip)
            wrote = ""
            if after != before:
                t.changes += 1
                wrote = f" (and stored state changed: {'; '.join(before.diff(after))})"
            self.last = None
            t.fail(f"{label}: {status} {brief(answer)}{wrote}{logged}")
            self._still_up(t, label)
        elif logged:
            t.fail(f"{label}: {status}, and the server logged{logged}")
        if 200 <= status < 300:
            t.ok += 1
            self.last = None
        elif 400 <= status < 500:
            t.refused += 1
            if sentence(answer) is None:
                t.fail(f"{label}: {status} without a sentence: {brief(answer)}")
            after = self.store.snapshot(skip)
            self.last = (skip, after)
            if after != before:
                t.changes += 1
                t.fail(f"{label}: {status} refused, yet stored state changed: {'; '.join(before.diff(after))}")
        elif status < 500:
            t.other += 1
            self.last = None
        if owned is not None:
            self._check_owned(t, label, status, owned)
        return answer

    def _check_owned(self, t: Tally, label: str, status: int, owned: Owned) -> None:
        now = self.store.owned_by(owned.node_id, owned.name)
        if now != owned.rows:
            t.changes += 1
            t.fail(f"{label}: {status}, and node {owned.name}'s rows changed: {'; '.join(owned.rows.diff(now))}")
            owned.rows = now  # judged once: the next mutant is compared with what is there now

    def _tracebacks(self, t: Tally) -> str:
        found = self.serve.log.tracebacks(self.serve.log.new())
        if not found:
            return ""
        t.tracebacks += len(found)
        return " | server: " + " | ".join(dict.fromkeys(found))

    def _still_up(self, t: Tally, label: str) -> None:
        for base in (f"http://{self.serve.admin}", f"http://{self.serve.gateway}"):
            if not self.serve.healthy(base):
                t.fail(f"{label}: the server no longer answers {base}/healthz")
                raise ServerGone(t.verdict())


def dumps(doc: object) -> bytes:
    """The body as a client sends it (Python's JSON: big integers written out in full)."""
    return json.dumps(doc).encode()
