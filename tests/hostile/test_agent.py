"""The agent endpoints, as a hostile or broken node A would call them: report, heartbeat, scan, register.

Every leaf of each real document gets the mutants for its type
(``mutants.BY_TYPE``), and node B's value at the same place; whatever A sends, B's rows stay as
they were, and a refusal changes nothing at all.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

import httpx
import pytest

from agent.simulator import fleet as F
from tests.hostile import mutants as M
from tests.hostile.fleet import A, B, Hostile, machine_id, with_weights
from tests.hostile.probe import dumps, tally

pytestmark = [pytest.mark.slow, pytest.mark.hostile]

# Maps whose keys a node chooses (adapter, counter, engine and fabric names): one shape, and their keys mutated too.
MAPS = frozenset({"nics", "counters", "engines", "fabrics"})
HIJACK = "http://169.254.169.254/latest/meta-data"


def call(h: Hostile, path: str, node: str, doc, *, flush: Callable[[httpx.Response], bool] | None = None):
    """The request and the wait for what its answer queued (a beat is written by the next flush)."""
    sent: list[datetime] = []

    def request() -> httpx.Response:
        sent.append(datetime.now(UTC))
        headers = {**h.auth(node), "content-type": "application/json"}
        return h.agent.post(path, content=dumps(doc), headers=headers)

    def settle(answer: httpx.Response) -> str | None:
        if flush is not None and answer.status_code == 200 and flush(answer):
            return h.wait_flushed(node, sent[0])
        return None

    return request, settle


def unchanged(answer: httpx.Response) -> bool:
    """An unchanged report is taken like a heartbeat: queued, written by the next flush."""
    try:
        return bool(answer.json().get("unchanged"))
    except ValueError:
        return False


def base_accepted(t, answer: httpx.Response | None) -> None:
    """The unmutated document must be accepted, or every mutant only tests the same refusal."""
    if answer is None or not answer.is_success:
        got = "no answer" if answer is None else f"{answer.status_code} {answer.text[:300]}"
        t.fail(f"{t.surface}: the unmutated document itself was not accepted: {got}")


def every_beat(answer: httpx.Response) -> bool:
    return True


def test_every_leaf_of_a_full_report(hostile: Hostile):
    h, t = hostile, tally("report")
    owned = h.owned_b()
    bases = [
        ("h100-hgx", h.reports[A]),
        ("gb200 tray", with_weights(F.build_fleet("gb200-nvl72:1")[0].report(), A)),
        ("a100-mig", with_weights(F.build_fleet("a100-mig:1")[0].report(), A)),
    ]
    seen: set[str] = set()
    for label, base in bases:
        first = h.agent.post("/report", json=base, headers=h.auth(A))
        h.prober.forget()
        if first.status_code != 200:
            t.fail(f"report: the {label} report itself was refused: {first.status_code} {first.text[:300]}")
            continue
        for case in M.cases(base, maps=MAPS, foreign=h.reports[B], seen=seen):
            request, settle = call(h, "/report", A, case.doc, flush=unchanged)
            h.prober.send(t, f"{label} report.{case.where}", str(case.mutant), request, settle=settle, owned=owned)
    h.agent.post("/report", json=h.reports[A], headers=h.auth(A))
    h.prober.forget()
    assert t.verdict() is None, t.verdict()


def hijacks(h: Hostile) -> list[tuple[str, dict]]:
    """A's beats that claim what is B's: rank 0 of the replica they share, B's own replica."""
    base = h.beats[A]
    ra_entry, shared = base["shards"]
    rab, rb = h.ids["rab"], h.ids["rb"]
    rank0 = {"id": f"{rab}-0", "replica": rab, "rank": 0, "state": "ready", "endpoint": HIJACK}
    theirs = {"id": f"{rb}-0", "replica": rb, "rank": 0}
    progress = {**shared, "fetch": {"source": "x", "bytes_done": 7}}

    def beat(*shards: dict) -> dict:
        return {**base, "shards": list(shards)}

    return [
        ("shards: rank 1 starting", beat(ra_entry, {**shared, "state": "starting"})),
        ("shards: rank 1 ready again, and rank 0 (B's) claimed at another URL", beat(ra_entry, shared, rank0)),
        ("shards: rank 1 with new progress, and rank 0 (B's) claimed", beat(ra_entry, progress, rank0)),
        ("shards: B's own replica claimed failed", beat(ra_entry, shared, {**theirs, "state": "failed"})),
        ("shards: B's own replica claimed ready at another URL", beat({**rank0, **theirs})),
    ]


def test_every_leaf_of_a_heartbeat(hostile: Hostile):
    h, t = hostile, tally("heartbeat")
    owned = h.owned_b()
    base = h.beats[A]
    for case in M.cases(base, foreign=h.beats[B]):
        request, settle = call(h, "/heartbeat", A, case.doc, flush=every_beat)
        h.prober.send(t, f"heartbeat.{case.where}", str(case.mutant), request, settle=settle, owned=owned)
    for label, doc in hijacks(h):
        request, settle = call(h, "/heartbeat", A, doc, flush=every_beat)
        h.prober.send(t, "heartbeat", label, request, settle=settle, owned=owned)
    h.beat(A, base)
    h.prober.forget()
    assert t.verdict() is None, t.verdict()


def test_every_leaf_of_a_scan_upload(hostile: Hostile):
    """Each upload is sent with a scan of A's fabric handed to A, as the planner and the report would."""
    h, t = hostile, tally("scan")
    owned = h.owned_b()
    scan = h.orm.call("arm_scan", node=A, fabric=h.fabrics[A])
    assert scan is not None, "the planner did not hand node A its fabric's scan"
    where = {"fabric": scan["fabric"], "hca": scan["hca"], "port": scan["port"]}
    bases = [
        ("output", {**where, "output": F.scan_capture(), "took_ms": 900}),
        ("error", {**where, "error": "ibnetdiscover: exited 255: no subnet manager answered"}),
    ]
    foreign = {"fabric": h.fabrics[B], "hca": "mlx5_0", "port": 1}
    seen: set[str] = set()
    for label, base in bases:
        for case in [M.Case((), M.Mutant("(unchanged)", base), base), *M.cases(base, foreign=foreign, seen=seen)]:
            if h.orm.call("arm_scan", node=A, fabric=h.fabrics[A]) is None:
                t.fail(f"scan: the planner did not hand A its fabric's scan again before {case.where} ← {case.mutant}")
            h.prober.forget()
            request, _ = call(h, "/scan", A, case.doc)
            answer = h.prober.send(t, f"{label} upload.{case.where}", str(case.mutant), request, owned=owned)
            if not case.path:
                base_accepted(t, answer)
    assert t.verdict() is None, t.verdict()


def test_every_leaf_of_a_registration(hostile: Hostile):
    """A registration with the join token; the report it carries gets the CORE mutants only."""
    h, t = hostile, tally("register")
    owned = h.owned_b()
    name = "hostile-r"
    base = {"name": name, "machine_id": machine_id(name), "report": F.build_fleet("cpu:1")[0].report()}
    foreign = {"name": B, "machine_id": machine_id(B), "report": h.reports[B]}
    join = {"Authorization": f"Bearer {h.serve.secret('join-token')}", "content-type": "application/json"}
    unchanged_case = M.Case((), M.Mutant("(unchanged)", base), base)
    for case in [unchanged_case, *M.cases(base, foreign=foreign, core_under=("report",))]:

        def request(doc=case.doc) -> httpx.Response:
            return h.agent.post("/register", content=dumps(doc), headers=join)

        answer = h.prober.send(t, f"register.{case.where}", str(case.mutant), request, owned=owned)
        if not case.path:
            base_accepted(t, answer)
    assert t.verdict() is None, t.verdict()
