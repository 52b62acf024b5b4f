"""The agent loop's promises: report cadence, backoff with jitter, recovery with a full report."""

from __future__ import annotations

import asyncio
import itertools
import random

import httpx

from agent.client import Busy, ControlPlane, Refused, Registration, Unreachable
from agent.loop import BACKOFF_MAX_S, AgentLoop, Identity, backoff_s


class FakePlane:
    """A control plane that can be switched off, recording what it was sent."""

    def __init__(self) -> None:
        self.up = True
        self.sent: list[str] = []
        self.credential = None
        self.revoked = False

    async def register(self, join, name, machine_id, report):
        self._check("register")
        return Registration(node=name, credential="cred", heartbeat_interval_s=5, report_interval_s=60)

    async def report(self, report):
        self._check("report")
        return {"shards": [{"id": "r-0"}]}

    async def heartbeat(self, beat):
        self._check("heartbeat")
        if self.revoked:
            raise Refused(401, "revoked")
        return {"shards": [{"id": "r-0"}], "send_report": False}

    def _check(self, kind: str) -> None:
        if not self.up:
            raise Unreachable("down")
        self.sent.append(kind)


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


async def report() -> dict:
    return {"gpus": []}


async def beat() -> dict:
    return {}


def make(plane: FakePlane, clock: Clock, token: str | None = "join") -> AgentLoop:
    return AgentLoop(plane, Identity("n", "m"), token, report, beat, rng=random.Random(1), clock=clock)


def test_register_then_heartbeats_then_a_report_every_minute():
    plane, clock = FakePlane(), Clock()
    loop = make(plane, clock)

    async def go():
        for _ in range(3):
            await loop.turn()
            clock.t += 5
        clock.t += 60
        await loop.turn()

    asyncio.run(go())
    assert plane.sent == ["register", "heartbeat", "heartbeat", "report"]
    assert loop.state.desired_shards == [{"id": "r-0"}]


def test_backoff_grows_with_full_jitter_and_is_capped():
    rng = random.Random(7)
    for failures in range(1, 30):
        ceiling = min(BACKOFF_MAX_S, 2 ** min(failures, 16))
        delays = [backoff_s(failures, rng) for _ in range(200)]
        assert all(0 <= d <= ceiling for d in delays)
        assert max(delays) > ceiling * 0.8, "full jitter spreads over the whole range"


def test_an_outage_is_waited_out_and_ends_with_a_full_report():
    plane, clock = FakePlane(), Clock()
    loop = make(plane, clock)

    async def go():
        await loop.turn()  # register
        plane.up = False
        delays = [await loop.turn() for _ in range(6)]
        plane.up = True
        await loop.turn()
        return delays

    delays = asyncio.run(go())
    assert loop.state.failures == 0
    assert plane.sent[-1] == "report", "what changed meanwhile reaches the server first"
    assert all(d <= BACKOFF_MAX_S for d in delays) and sum(delays) > 0


def test_a_revoked_credential_registers_again_with_the_join_token():
    plane, clock = FakePlane(), Clock()
    loop = make(plane, clock)

    async def go():
        await loop.turn()
        plane.revoked = True
        await loop.turn()
        plane.revoked = False
        await loop.turn()

    asyncio.run(go())
    assert plane.sent == ["register", "heartbeat", "register"]


def test_without_a_join_token_an_unregistered_agent_says_so():
    plane, clock = FakePlane(), Clock()
    loop = make(plane, clock, token=None)
    asyncio.run(loop.turn())
    assert "join token" in loop.state.last_error and plane.sent == []


class RefusingPlane(FakePlane):
    """A control plane that refuses full reports (a value it cannot store) and asks for one at every beat."""

    def __init__(self) -> None:
        super().__init__()
        self.refuse = True

    async def register(self, join, name, machine_id, report):
        if report is not None and self.refuse:
            self._check("register+report")
            raise Refused(400, "the report was not stored: report.hostname: 'a\\x00' holds a NUL character")
        return await super().register(join, name, machine_id, report)

    async def report(self, report):
        if self.refuse:
            self._check("report")
            raise Refused(400, "the report was not stored: gpus[3].memory_mb: 2**70 is more than the column holds")
        return await super().report(report)

    async def heartbeat(self, beat):
        answer = await super().heartbeat(beat)
        return {**answer, "send_report": True}


def test_a_refused_report_is_said_and_heartbeats_go_on_without_resending_it(caplog):
    plane, clock = RefusingPlane(), Clock()
    loop = make(plane, clock)
    version = {"n": 1}

    async def changing_report() -> dict:
        return {"gpus": [], "hostname": f"v{version['n']}"}

    loop.make_report = changing_report

    async def go():
        delays = []
        for _ in range(30):  # two and a half minutes of turns
            delays.append(await loop.turn())
            clock.t += 5
        return delays

    delays = asyncio.run(go())
    assert plane.sent[:3] == ["register+report", "register", "heartbeat"], "joined without the report"
    assert plane.sent.count("report") == 0, "the same refused report is not sent again"
    assert plane.sent.count("heartbeat") == 29 and set(delays) == {5}
    assert "refused this node's full report" in caplog.text and "heartbeats go on" in caplog.text
    assert loop.state.last_error.startswith("report refused: ")

    version["n"] = 2  # discovery saw a change: that report is sent, and its refusal too is kept to
    loop.request_report()
    asyncio.run(go())
    assert plane.sent.count("report") == 1 and plane.sent[-1] == "heartbeat"

    plane.refuse = False
    clock.t += 600  # the same report is tried again after a while: the server may have been upgraded
    asyncio.run(loop.turn())
    assert plane.sent[-1] == "report" and loop.state.refused_digest is None and loop.state.last_error is None


def test_prefetches_follow_the_heartbeat_answers_and_a_report_answer_leaves_them_be():
    class PrefetchPlane(FakePlane):
        listed = [{"model": "m", "source": "hf://o/m"}]

        async def heartbeat(self, beat):
            answer = await super().heartbeat(beat)
            return {**answer, "prefetch": self.listed} if self.listed else answer

    plane, clock, told = PrefetchPlane(), Clock(), []
    loop = AgentLoop(
        plane, Identity("n", "m"), "join", report, beat, on_prefetch=told.append, rng=random.Random(1), clock=clock
    )

    async def go():
        await loop.turn()  # register
        await loop.turn()  # heartbeat: the prefetch is handed on
        clock.t += 61
        await loop.turn()  # a full report: its answer says nothing of prefetches
        plane.listed = []
        await loop.turn()  # heartbeat without any: none pending

    asyncio.run(go())
    assert plane.sent == ["register", "heartbeat", "report", "heartbeat"]
    assert told == [[{"model": "m", "source": "hf://o/m"}], []]


class FailingOverPlane(FakePlane):
    """A control plane whose database is failing over: registrations and full reports are answered 503 with
    Retry-After (core.errors), while heartbeats are still taken from memory (agentapi.fast)."""

    def __init__(self) -> None:
        super().__init__()
        self.failing_over = False
        self.tried: list[tuple[str, float]] = []
        self.clock: Clock | None = None

    async def register(self, join, name, machine_id, report):
        self._busy("register")
        return await super().register(join, name, machine_id, report)

    async def report(self, report):
        self._busy("report")
        return await super().report(report)

    def _busy(self, kind: str) -> None:
        self.tried.append((kind, self.clock.t if self.clock else 0.0))
        if self.failing_over:
            raise Busy("answered 503, retry after 5 s", 5.0)


def test_a_report_answered_busy_waits_its_retry_after_while_heartbeats_go_on():
    plane, clock = FailingOverPlane(), Clock()
    plane.clock = clock
    loop = make(plane, clock)

    async def go():
        await loop.turn()  # register
        plane.failing_over = True
        loop.request_report()
        delays = []
        for _ in range(12):  # 60 s of failover, past a node's grace (20 s)
            delays.append(await loop.turn())
            clock.t += delays[-1]
        plane.failing_over = False
        for _ in range(3):
            clock.t += await loop.turn()
        return delays

    delays = asyncio.run(go())
    # Every turn of the failover beat on the usual period: the node never went silent.
    assert delays == [5] * 12 and plane.sent.count("heartbeat") >= 12, plane.sent
    # The report was tried again no sooner than Retry-After, and no later than half again (the jitter).
    tries = [t for kind, t in plane.tried if kind == "report"]
    gaps = [b - a for a, b in itertools.pairwise(tries)]
    assert len(tries) >= 6 and all(5 <= g <= 7.5 + 5 for g in gaps), tries
    assert loop.state.failures == 0
    # Once the database is back the report is taken, and nothing is left said.
    assert plane.sent[-3:].count("report") == 1 and loop.state.last_error is None, (plane.sent, loop.state)


class SlowReportPlane(FakePlane):
    """A control plane whose full reports time out (no answer, no Retry-After) while heartbeats are answered:
    a host slow under big reports, or one killed with reports in flight while HAProxy still sends it some."""

    def __init__(self) -> None:
        super().__init__()
        self.reports_time_out = False
        self.tried: list[float] = []
        self.clock: Clock | None = None

    async def report(self, report):
        if self.reports_time_out:
            self.tried.append(self.clock.t)
            raise Unreachable("http://cp: ReadTimeout: timed out")
        return await super().report(report)


def test_a_report_that_times_out_backs_off_on_its_own_and_never_delays_the_next_heartbeat():
    plane, clock = SlowReportPlane(), Clock()
    plane.clock = clock
    loop = make(plane, clock)

    async def go():
        await loop.turn()  # register
        plane.reports_time_out = True
        loop.request_report()
        delays = []
        for _ in range(24):  # two minutes of reports timing out, six times a node's grace (20 s)
            delays.append(await loop.turn())
            clock.t += delays[-1]
        plane.reports_time_out = False
        for _ in range(30):
            clock.t += await loop.turn()
        return delays

    delays = asyncio.run(go())
    # Every turn heartbeat on the usual period: a report's timeout is no reason to go silent.
    assert delays == [5] * 24 and plane.sent.count("heartbeat") >= 24, (delays, plane.sent)
    assert loop.state.failures == 0
    # The report was tried again on a backoff of its own (growing: fewer tries than turns), and taken once
    # the plane could take it.
    assert 2 <= len(plane.tried) < 24, plane.tried
    assert "report" in plane.sent[1:] and loop.state.report_failures == 0 and loop.state.last_error is None


def test_a_report_that_failed_is_sent_first_once_an_unreachable_plane_answers():
    plane, clock = SlowReportPlane(), Clock()
    plane.clock = clock
    loop = make(plane, clock)

    async def go():
        await loop.turn()  # register
        plane.reports_time_out = True
        loop.request_report()
        await loop.turn()  # the report times out; the heartbeat after it is answered
        plane.reports_time_out, plane.up = False, False
        clock.t += await loop.turn()  # nothing answers: the plane is away
        plane.up = True
        await loop.turn()

    asyncio.run(go())
    assert plane.sent == ["register", "heartbeat", "report"], plane.sent


def test_a_registration_answered_busy_waits_its_retry_after_not_a_growing_backoff():
    plane, clock = FailingOverPlane(), Clock()
    plane.failing_over = True
    loop = make(plane, clock)

    async def go():
        return [await loop.turn() for _ in range(10)]

    delays = asyncio.run(go())
    assert all(5 <= d <= 7.5 for d in delays) and not loop.state.registered, delays
    plane.failing_over = False
    asyncio.run(loop.turn())
    assert loop.state.registered


def test_busy_is_a_503_or_429_with_retry_after_and_anything_else_is_unreachable_or_refused():
    def answer(request: httpx.Request) -> httpx.Response:
        status, wait = {"/a": (503, "5"), "/b": (429, "2"), "/c": (503, None), "/d": (503, "soon"), "/e": (400, "5")}[
            request.url.path
        ]
        return httpx.Response(status, json={"error": "no"}, headers={"Retry-After": wait} if wait else {})

    async def outcome(path: str):
        plane = ControlPlane("http://cp", client=httpx.AsyncClient(transport=httpx.MockTransport(answer)))
        try:
            await plane._post(path, "t", {})
        except (Refused, Unreachable) as exc:
            return type(exc).__name__, getattr(exc, "retry_after_s", None)
        finally:
            await plane.close()

    got = {path: asyncio.run(outcome(path)) for path in ("/a", "/b", "/c", "/d", "/e")}
    assert got == {
        "/a": ("Busy", 5.0),
        "/b": ("Busy", 2.0),
        "/c": ("Unreachable", None),
        "/d": ("Unreachable", None),
        "/e": ("Refused", None),
    }
