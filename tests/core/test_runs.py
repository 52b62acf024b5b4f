"""A run begins once however often it arrives (core.runs), and the beat sends again a run no worker began
(llmgw.beat).

The beat's rule is pure and tested over every timing; the scheduler itself is
tested on a real Redis, with the run's message taken from the queue as a worker
killed at that instant would take it.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
from celery import Celery, states
from django.db import connection
from hypothesis import given
from hypothesis import strategies as st

from core import runs
from core.models import TaskRun
from llmgw import beat
from observability.tasks import tick
from tests.core.test_worker_guard import Redis, redis_client

TICK = "observability.tasks.tick"


# --- a run begins once ---------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_run_begins_once_and_the_next_one_begins():
    t0 = datetime(2026, 12, 5, tzinfo=UTC)
    assert runs.begin(TICK, "a", t0)
    assert not runs.begin(TICK, "a", t0 + timedelta(seconds=1)), "the same run delivered again"
    assert TaskRun.objects.get(name=TICK).last_started == t0, "a skipped delivery records no start"
    assert runs.begin(TICK, "b", t0 + timedelta(seconds=5))
    row = TaskRun.objects.get(name=TICK)
    assert (row.last_run, row.last_started) == ("b", t0 + timedelta(seconds=5))


@pytest.mark.django_db
def test_the_beat_asks_whether_its_run_or_a_later_one_began():
    sent = datetime(2026, 12, 5, tzinfo=UTC)
    assert not runs.began(TICK, "a", sent), "no row: nothing began"
    runs.begin(TICK, "earlier", sent - timedelta(seconds=1))
    assert not runs.began(TICK, "a", sent), "a run that began before it was sent is not it"
    runs.begin(TICK, "a", sent + timedelta(seconds=1))
    assert runs.began(TICK, "a", sent)
    runs.begin(TICK, "queued by a change", sent + timedelta(seconds=2))
    assert runs.began(TICK, "a", sent), "another run that began since did the work"


@pytest.mark.django_db
def test_a_second_delivery_of_a_run_is_ignored_and_not_counted():
    first = tick.apply(task_id="run-1")
    again = tick.apply(task_id="run-1")
    assert (first.state, again.state) == (states.SUCCESS, states.IGNORED)
    row = TaskRun.objects.get(name=TICK)
    assert (row.last_run, row.runs, row.last_ok) == ("run-1", 1, True)
    assert tick.apply(task_id="run-2").state == states.SUCCESS
    assert TaskRun.objects.get(name=TICK).runs == 2


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("row_exists", [False, True], ids=["first run", "later run"])
def test_of_deliveries_racing_for_one_run_exactly_one_begins_it(row_exists):
    """Eight workers given the same run at once."""
    for attempt in range(10):
        TaskRun.objects.filter(name=TICK).delete()
        if row_exists:
            runs.begin(TICK, "before")
        start, answers = threading.Barrier(8), []

        def deliver(start=start, answers=answers, run_id=f"run-{attempt}") -> None:
            start.wait()
            try:
                answers.append(runs.begin(TICK, run_id))
            finally:
                connection.close()

        threads = [threading.Thread(target=deliver) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(answers) == [False] * 7 + [True], (attempt, answers)


# --- the beat's rule -----------------------------------------------------------------------------------------------


@given(
    period=st.floats(0.5, 3600),
    share=st.floats(0.1, 1.0),
    began_at=st.one_of(st.none(), st.integers(0, 10)),
    lateness=st.floats(0, 2),
)
def test_a_run_is_sent_again_each_quarter_period_until_it_begins_or_expires(period, share, began_at, lateness):
    """Checked a quarter period apart (each check as late as the beat's wake-up makes it), sent again at each
    check until it began, never once it began or expired: with the entries' expiry (0.9 of a period) at most three
    times, the first a quarter period after the first send."""
    expires = period * share
    sent = beat.watch("e", TICK, "id", period, expires, 100.0, datetime.now(UTC))
    assert sent.next_check == pytest.approx(100.0 + max(beat.SMALLEST_CHECK_S, period / 4))
    now, checks, resends, watched = 100.0, 0, [], sent
    while watched is not None:
        now = watched.next_check + lateness * watched.every_s / 4
        again, watched = beat.after_check(watched, began_at is not None and checks >= began_at, now)
        checks += 1
        if again:
            resends.append(now)
            assert now < 100.0 + expires
        assert checks < 1000
    assert all(b - a >= sent.every_s * (1 - 1e-9) for a, b in itertools.pairwise(resends))
    if began_at is not None:
        assert len(resends) <= began_at
    assert len(resends) <= max(1, expires / sent.every_s)
    if share <= 0.9 and period / 4 >= beat.SMALLEST_CHECK_S:
        assert len(resends) <= 3


# --- the beat on a real Redis --------------------------------------------------------------------------------------


@pytest.fixture
def redis(tmp_path):
    server = Redis(tmp_path)
    yield server
    server.stop()


def queued(client) -> list[dict]:
    return [json.loads(m) for m in client.lrange("celery", 0, -1)]


def tick_until_forgotten(scheduler: beat.Scheduler, deadline: float, client=None) -> list[str]:
    """Tick as the beat does until it watches no run (it must by ``deadline``): the ids sent meanwhile."""
    sent: list[str] = []
    while scheduler.watched:
        assert time.monotonic() < deadline + 1.0, f"still watched: {scheduler.watched}"
        scheduler.tick()
        if client is not None:
            sent += [m["headers"]["id"] for m in queued(client)]
            client.delete("celery")
        time.sleep(0.02)
    return sent


@pytest.mark.slow
@pytest.mark.django_db
def test_a_run_taken_by_a_dying_worker_is_sent_again_under_its_id_and_only_until_it_began(redis, tmp_path):
    """The message taken off the queue as a worker killed at that instant takes it (never acknowledged): a quarter
    period later the beat sends the same run again, with the first send's expiry; once a worker began it, or it
    expired, it is not sent again."""
    app = Celery("beat-probe", broker=redis.url, set_as_current=False)
    period = 2.0
    app.conf.beat_schedule = {"tick": {"task": TICK, "schedule": period, "options": {"expires": 0.9 * period}}}
    scheduler = beat.Scheduler(app=app, schedule_filename=str(tmp_path / "schedule"), lazy=False)
    client = redis_client(redis)
    try:
        # Sent as the beat sends a due entry; the next is due a period later, after this test's checks.
        sent_at = time.monotonic()
        scheduler.apply_async(scheduler.schedule["tick"])
        _, raw = client.brpop("celery", timeout=5)
        first = json.loads(raw)
        run_id, expires = first["headers"]["id"], first["headers"]["expires"]
        assert scheduler.tick() <= period / 4 + 0.05, "the beat wakes for its check"
        assert queued(client) == []

        time.sleep(max(0.0, sent_at + period / 4 + 0.05 - time.monotonic()))
        scheduler.tick()
        again = queued(client)
        assert [(m["headers"]["id"], m["headers"]["task"]) for m in again] == [(run_id, TICK)], "the same run again"
        lives = datetime.fromisoformat(again[0]["headers"]["expires"]) - datetime.fromisoformat(expires)
        assert timedelta(seconds=-0.2) < lives <= timedelta(0), "with the first send's expiry, never a later one"

        runs.begin(TICK, run_id)  # a worker began the copy sent again
        tick_until_forgotten(scheduler, sent_at + period)
        assert len(queued(client)) == 1, "a run that began is not sent again"

        # Another run whose every copy is lost, by a fresh beat (its entry next due two periods on): sent again
        # at each check until it expires, then forgotten.
        scheduler.close()
        scheduler = beat.Scheduler(app=app, schedule_filename=str(tmp_path / "schedule2"), lazy=False)
        client.delete("celery")
        lost_at = time.monotonic()
        scheduler.apply_async(scheduler.schedule["tick"])
        _, raw = client.brpop("celery", timeout=5)
        lost = json.loads(raw)["headers"]["id"]
        copies = tick_until_forgotten(scheduler, lost_at + period, client)
        # A quarter, a half and three quarters of a period on (each check a quarter period after the one
        # before it, so fewer when the checks run late): expired at 0.9.
        assert copies == [lost] * len(copies) and 1 <= len(copies) <= 3, copies
    finally:
        scheduler.close()
        app.close()


@pytest.mark.django_db
def test_while_the_database_cannot_be_asked_nothing_is_sent_again(monkeypatch, tmp_path):
    from django.db import OperationalError

    app = Celery("beat-probe", broker="memory://", set_as_current=False)
    app.conf.beat_schedule = {"tick": {"task": TICK, "schedule": 2.0, "options": {"expires": 1.8}}}
    scheduler = beat.Scheduler(app=app, schedule_filename=str(tmp_path / "schedule"), lazy=False)
    sent = []
    monkeypatch.setattr(scheduler, "send_task", lambda *a, **kw: sent.append(kw) or None)
    scheduler.watched["tick"] = beat.watch("tick", TICK, "x", 2.0, 1.8, time.monotonic() - 1, datetime.now(UTC))

    def away(*_a, **_kw):
        raise OperationalError("the server closed the connection")

    monkeypatch.setattr(runs, "began", away)
    scheduler.tick()
    assert sent == [] and scheduler.watched["tick"].resent == 0
    scheduler.close()
    app.close()


def test_every_periodic_task_begins_through_core_runs_and_the_beat_confirms_each_run():
    from llmgw.celery import PERIODIC, app

    app.loader.import_default_modules()
    assert {task: isinstance(app.tasks[task], runs.Run) for task, _ in PERIODIC.values()} == {
        task: True for task, _ in PERIODIC.values()
    }
    assert app.conf.beat_scheduler == "llmgw.beat:Scheduler"
