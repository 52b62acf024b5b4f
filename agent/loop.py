"""One agent's life: register once, then full reports and light heartbeats, forever.

Steps, each turn:

1. Not registered: register with the join token (and the current report).
2. A full report when discovery saw a change, when the control plane asks
   for one, and once a minute regardless — a fabric manager restart drops
   every card of a domain at once, and only a fresh report shows it.
3. Otherwise a light heartbeat: liveness, load, what the shards are doing.
4. The control plane unreachable: wait with exponential backoff and full
   jitter (never a thundering herd on a recovering server), keep running the
   shards, and send the current state — a full report — once it answers.
5. A full report refused (4xx: a value the server cannot store): say so in
   the log, keep heartbeating, and do not send that same report again until
   it changes or ``REFUSED_RETRY_S`` have passed (the server may have been
   upgraded meanwhile). The server keeps what it had, and shows why on the
   node. A registration refused for its report registers without it.
6. A full report answered "busy" (503 or 429 with ``Retry-After``: the
   database failing over): heartbeat at once and on the usual period — the
   heartbeat is taken from memory meanwhile, so the node stays reachable — and
   send the report again after the Retry-After, jittered and bounded
   (``busy_s``). A busy registration waits the same, not the growing backoff.
7. A full report that failed otherwise (timed out, or a 5xx without
   Retry-After: a server slow under a big report, a host dying under it):
   heartbeat at once, and send the report again after a backoff of its own
   (``report_failures``), so the heartbeats keep their period whatever
   happens to reports. Only when the heartbeat fails too is the control plane
   unreachable (step 4): then the report's own wait is dropped, and it is sent
   first once the plane answers.

The loop knows nothing of where reports come from: the real agent gives it
discovery, the simulator gives it captures with faults applied.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from agent import protocol
from agent.client import Busy, ControlPlane, Refused, Registration, Unreachable

log = logging.getLogger(__name__)

BACKOFF_BASE_S = 1.0
BACKOFF_MAX_S = 60.0
REFUSED_RETRY_S = 600.0
BUSY_MAX_S = 60.0
"""The longest a Retry-After is honoured: a server's mistake must not silence a report for long."""


@dataclass
class Identity:
    """Who this agent is: its name, its machine, and its credential once it has one."""

    name: str
    machine_id: str
    credential: str | None = None


@dataclass
class LoopState:
    registered: bool = False
    failures: int = 0
    last_report_at: float = float("-inf")
    last_digest: str | None = None
    want_report: bool = True
    desired_shards: list[dict] = field(default_factory=list)
    collecting: set[str] = field(default_factory=set)
    collected: list[dict] = field(default_factory=list)
    # The digest of the last full report the server refused, and when; None once one is taken.
    refused_digest: str | None = None
    refused_at: float = float("-inf")
    # A report answered busy is not sent again before this (clock()); heartbeats go on meanwhile.
    report_not_before: float = float("-inf")
    # Full reports that failed in a row (not busy, not refused): their own backoff, apart from ``failures``.
    report_failures: int = 0

    last_error: str | None = None


def backoff_s(failures: int, rng: random.Random) -> float:
    """Full jitter: anywhere between zero and the exponential ceiling."""
    ceiling = min(BACKOFF_MAX_S, BACKOFF_BASE_S * (2 ** min(failures, 16)))
    return rng.uniform(0, ceiling)


def busy_s(retry_after_s: float, rng: random.Random) -> float:
    """How long to wait after a busy answer: its Retry-After (at most BUSY_MAX_S), and up to half again.

    Never sooner than asked (the server said when it expects to be back), and
    spread so that every node told "5 s" at once does not come back at once.
    """
    wait = min(max(retry_after_s, 0.0), BUSY_MAX_S)
    return wait * rng.uniform(1.0, 1.5)


class AgentLoop:
    """Drives one node's protocol. ``make_report`` and ``make_heartbeat`` say what to send."""

    def __init__(
        self,
        plane: ControlPlane,
        identity: Identity,
        join_token: str | None,
        make_report: Callable[[], Awaitable[dict]],
        make_heartbeat: Callable[[], Awaitable[dict]],
        on_registered: Callable[[Registration], None] | None = None,
        on_shards: Callable[[list[dict]], None] | None = None,
        on_scan: Callable[[dict], Awaitable[dict]] | None = None,
        on_collect: Callable[[list[str]], Awaitable[list[dict]]] | None = None,
        on_prefetch: Callable[[list[dict]], None] | None = None,
        heartbeat_interval_s: float = protocol.HEARTBEAT_INTERVAL_S,
        report_interval_s: float = protocol.REPORT_INTERVAL_S,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.plane = plane
        self.identity = identity
        self.join_token = join_token
        self.make_report = make_report
        self.make_heartbeat = make_heartbeat
        self.on_registered = on_registered
        self.on_shards = on_shards
        self.on_scan = on_scan
        self.on_collect = on_collect
        self.on_prefetch = on_prefetch
        self.heartbeat_interval_s = heartbeat_interval_s
        self.report_interval_s = report_interval_s
        self.rng = rng or random.Random()
        self.clock = clock
        self.state = LoopState()
        # Set when the intervals were chosen locally (the simulator, tests) rather than by the server.
        self.intervals_fixed = False

        if identity.credential:
            plane.credential = identity.credential
            self.state.registered = True

    def request_report(self) -> None:
        """Discovery saw a change (or a test injected one): send a full report next turn."""
        self.state.want_report = True

    async def _register(self) -> None:
        if not self.join_token:
            raise Refused(401, "no credential and no join token: give --join-token once")
        report = await self.make_report()
        digest = protocol.report_digest(report)
        try:
            registration = await self.plane.register(
                self.join_token, self.identity.name, self.identity.machine_id, report
            )
            self.state.last_digest = digest
        except Refused as exc:
            if not self._is_report_refusal(exc):
                raise
            # The report, not the node, was refused: join without it, and heartbeat.
            self._report_refused(digest, exc)
            registration = await self.plane.register(
                self.join_token, self.identity.name, self.identity.machine_id, None
            )

        self.identity.credential = registration.credential
        self.state.registered = True
        self.state.last_report_at = self.clock()
        self.state.want_report = False
        if not self.intervals_fixed:
            self.heartbeat_interval_s = registration.heartbeat_interval_s
            self.report_interval_s = registration.report_interval_s
        if self.on_registered:
            self.on_registered(registration)

    def _report_due(self) -> bool:
        if self.clock() < self.state.report_not_before:
            return False
        return self.state.want_report or self.clock() - self.state.last_report_at >= self.report_interval_s

    async def _send_report(self) -> dict:
        report = await self.make_report()
        digest = protocol.report_digest(report)
        if digest == self.state.refused_digest and self.clock() - self.state.refused_at < REFUSED_RETRY_S:
            self.state.last_report_at = self.clock()
            self.state.want_report = False
            return await self._send_heartbeat()  # the same report would be refused the same way
        try:
            answer = await self.plane.report(report)
        except Busy as exc:
            # The server is there but cannot take a report now: the node's liveness rides on the heartbeat.
            self.state.report_not_before = self.clock() + busy_s(exc.retry_after_s, self.rng)
            self.state.want_report = True
            self.state.last_error = f"report deferred: {exc}"
            return await self._send_heartbeat()
        except Unreachable as exc:
            # The report, not necessarily the plane, failed (a timeout under a big report, a host dying under
            # it): its own backoff, and the heartbeat at once. If that fails too, turn() backs off altogether.
            self.state.report_failures += 1
            self.state.report_not_before = self.clock() + backoff_s(self.state.report_failures, self.rng)
            self.state.want_report = True
            self.state.last_error = f"report failed: {exc}"
            return await self._send_heartbeat()
        except Refused as exc:
            if not self._is_report_refusal(exc):
                raise
            self._report_refused(digest, exc)
            return await self._send_heartbeat()
        self.state.last_digest = digest
        self.state.last_report_at = self.clock()
        self.state.want_report = False
        self.state.refused_digest = None
        self.state.report_failures = 0
        return answer

    @staticmethod
    def _is_report_refusal(exc: Refused) -> bool:
        """A 4xx about the body (not the credential): sending it again unchanged cannot help."""
        return exc.status in (400, 413, 422)

    def _report_refused(self, digest: str, exc: Refused) -> None:
        log.warning(
            "the control plane refused this node's full report (%s); heartbeats go on, and the report is sent "
            "again when it changes or in %.0f s",
            exc,
            REFUSED_RETRY_S,
        )
        self.state.refused_digest, self.state.refused_at = digest, self.clock()
        self.state.last_report_at = self.clock()
        self.state.want_report = False
        self.state.last_error = f"report refused: {exc.message}"

    async def _send_heartbeat(self) -> dict:
        beat = await self.make_heartbeat()
        if self.state.last_digest:
            beat["report_digest"] = self.state.last_digest
        sent, self.state.collected = self.state.collected, []
        if sent:
            beat["collected"] = sent
        try:
            answer = await self.plane.heartbeat(beat)
        except Exception:
            self.state.collected = sent + self.state.collected  # told next time instead
            raise
        self.state.collecting.difference_update(d["path"] for d in sent)
        # While the current report stands refused, the server asking for one is no news: it
        # lacks exactly that report. It is tried again on the schedule in _send_report.
        if answer.get("send_report") and self.state.refused_digest is None:
            self.state.want_report = True
        return answer

    async def turn(self) -> float:
        """One exchange with the control plane; returns how long to sleep before the next."""
        try:
            if not self.state.registered:
                await self._register()
                return self.heartbeat_interval_s
            answer: dict[str, Any] = await (self._send_report() if self._report_due() else self._send_heartbeat())
        except Busy as exc:
            # A registration or heartbeat answered busy: wait what the server asked, not the growing backoff.
            self.state.want_report = True
            self.state.last_error = str(exc)
            return busy_s(exc.retry_after_s, self.rng)
        except Unreachable as exc:
            self.state.failures += 1
            self.state.want_report = True  # the server may have missed changes meanwhile
            # The plane itself is away: the report goes first once it answers (step 4), not after its own wait.
            if self.state.report_failures:
                self.state.report_not_before = float("-inf")
            self.state.last_error = str(exc)
            return backoff_s(self.state.failures, self.rng)
        except Refused as exc:
            return self._refused(exc)
        except Exception as exc:  # a bug in discovery must not stop the heartbeats (logged: BLE allows it)
            log.exception("agent turn failed; trying again after a pause")
            self.state.failures += 1
            self.state.last_error = f"{type(exc).__name__}: {exc}"
            return backoff_s(self.state.failures, self.rng)
        self.state.failures = 0
        if self.state.refused_digest is None and self.clock() >= self.state.report_not_before:
            self.state.last_error = None
        if "shards" in answer:
            self.state.desired_shards = answer["shards"]
            if self.on_shards:
                self.on_shards(answer["shards"])
        if "scan" in answer and self.on_scan:
            await self._scan(answer["scan"])
        if answer.get("collect") and self.on_collect:
            await self._collect(answer["collect"])
        # Only a heartbeat's answer (it always says send_report) speaks for the prefetches:
        # one leaving them out means none is pending. A full report's answer says nothing of them.
        if "send_report" in answer and self.on_prefetch:
            self.on_prefetch(answer.get("prefetch") or [])
        return self.heartbeat_interval_s

    async def _collect(self, paths: list[str]) -> None:
        """Delete the weights an operator asked for; the results ride on the next heartbeat."""
        fresh = [p for p in paths if p not in self.state.collecting]
        if not fresh:
            return
        self.state.collecting.update(fresh)
        self.state.collected += await self.on_collect(fresh)
        self.state.want_report = True  # what is on disk changed

    def _refused(self, exc: Refused) -> float:
        self.state.last_error = exc.message
        if exc.status == 401 and self.state.registered and self.join_token:
            # The credential was revoked (or the node deleted): register again.
            self.state.registered = False
            return 0.0
        self.state.failures += 1
        return backoff_s(self.state.failures, self.rng)

    async def _scan(self, request: dict) -> None:
        """Run the topology scan the control plane asked for and upload what came of it."""
        body = await self.on_scan(request)
        try:
            await self.plane.upload_scan(
                {"fabric": request.get("fabric"), "hca": request.get("hca"), "port": request.get("port"), **body}
            )
        except (Unreachable, Refused) as exc:
            self.state.last_error = f"scan upload: {exc}"

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            delay = await self.turn()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=delay)
