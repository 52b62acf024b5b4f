"""A Celery worker that has gone quiet exits (core.worker_watch, llmgw.worker_guard); one that is busy or cut off stays.

The rule first, over whole sequences of looks (Hypothesis); then real
workers (``celery -A llmgw worker``, as deploy/systemd starts it) against a
redis-server of the test's own, with a 4 s window: one made deaf to its queue
(its consumer cancelled by a control command, while tasks wait), one whose
main thread is held (a control command of tests.core.stall_control that
sleeps in it), one kept busy and one whose Redis is stopped for longer than
the window, which must both stay.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from celery import Celery
from celery.utils.nodenames import worker_direct
from hypothesis import given, settings
from hypothesis import strategies as st

from core.worker_watch import Seen, WorkerWatch
from llmgw import worker_guard
from llmgw.supervisor import WORKER_POOL
from tests.deploy.multihost import free_port, redis_answers, wait_until

WINDOW = 10.0
RECONNECT = 7.0
SILENCE = 3.0
CHECKOUT = Path(__file__).resolve().parents[2]

# --- the rule --------------------------------------------------------------------------------------------------------

looks = st.lists(
    st.tuples(
        st.floats(0.1, 5.0),  # seconds since the previous look
        st.booleans(),  # Redis answers
        st.integers(0, 3),  # tasks waiting
        st.booleans(),  # room for more
        st.booleans(),  # the loop turned since the previous look
        st.booleans(),  # a task was received since the previous look
    ),
    max_size=60,
)


def replay(steps) -> list[tuple[Seen, str | None]]:
    watch, now, tick, received, out = WorkerWatch(WINDOW, RECONNECT), 0.0, 0.0, 0.0, []
    for gap, answers, waiting, room, turned, got in steps:
        now += gap
        tick = now if turned else tick
        received = now if got else received
        seen = Seen(now, answers, waiting if answers else 0, room, tick, received)
        out.append((seen, watch.look(seen)))
    return out


@given(looks)
def test_no_verdict_while_redis_is_silent_or_the_loop_turns_and_tasks_come(steps):
    """While Redis is silent nothing is judged; a verdict names what held for a whole window."""
    for seen, why in replay(steps):
        if not seen.redis_answers:
            assert why is None
        if why is not None and why.startswith("a task"):
            assert seen.has_room and seen.waiting > 0
            assert seen.now - seen.last_received >= WINDOW
        if why is not None and why.startswith("its event loop"):
            assert seen.now - seen.last_tick >= WINDOW


def resets(history) -> list[float]:
    """When Redis had been silent for SILENCE at a look: each time the watch forgets what it saw."""
    out, since = [], None
    for seen, _ in history:
        if seen.redis_answers:
            since = None
            continue
        since = seen.now if since is None else since
        if seen.now - since >= SILENCE:
            out.append(seen.now)
    return out


@given(looks)
def test_a_verdict_needs_a_whole_window_of_the_same_trouble(steps):
    """Deaf: every look of the last window saw its canary waiting and room; either: Redis never silent for long
    (SILENCE: one failed look is no outage) for a reconnect's longest wait and a window more."""
    history = replay(steps)
    for i, (seen, why) in enumerate(history):
        if why is None:
            continue
        # No silence long enough to count (SILENCE) within a window and a reconnect's wait, and none now.
        assert seen.redis_answers
        assert not any(t >= seen.now - WINDOW - RECONNECT for t in resets(history[: i + 1])), history
        window = [s for s, _ in history[: i + 1] if s.now >= seen.now - WINDOW]
        if why.startswith("a task"):
            assert all(s.waiting > 0 and s.has_room for s in window if s.redis_answers)


@settings(max_examples=50)
@given(st.floats(0.2, 3.0))
def test_a_deaf_worker_and_a_stuck_one_are_named(gap):
    watch, now = WorkerWatch(WINDOW, RECONNECT), 0.0
    verdicts = []
    while now < 3 * WINDOW and not verdicts:
        now += gap
        why = watch.look(Seen(now, True, 2, True, now, 0.0))
        verdicts += [why] if why else []
    assert verdicts and verdicts[0].startswith("a task sent to it alone") and now < WINDOW + RECONNECT + 2 * gap + 0.01
    watch, now, verdicts = WorkerWatch(WINDOW, RECONNECT), 0.0, []
    while now < 3 * WINDOW and not verdicts:
        now += gap
        why = watch.look(Seen(now, True, 0, True, 0.0, 0.0))
        verdicts += [why] if why else []
    assert verdicts and verdicts[0].startswith("its event loop") and now < WINDOW + RECONNECT + 2 * gap + 0.01


def test_the_window_is_read_from_the_environment():
    assert worker_guard.window_s({}) == worker_guard.DEFAULT_WINDOW_S
    assert worker_guard.window_s({"LLMGW_WORKER_DEAF_S": "0"}) == 0
    assert worker_guard.window_s({"LLMGW_WORKER_DEAF_S": " 12.5 "}) == 12.5
    with pytest.raises(ValueError, match="LLMGW_WORKER_DEAF_S='soon' is not a number"):
        worker_guard.window_s({"LLMGW_WORKER_DEAF_S": "soon"})


# --- real workers ----------------------------------------------------------------------------------------------------


class Redis:
    def __init__(self, root: Path) -> None:
        self.port, self.root, self.proc = free_port(), root, None
        self.start()

    def start(self) -> None:
        cmd = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(lambda: redis_answers(self.port), 20, "redis")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(20)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"


class Worker:
    """``celery -A llmgw worker`` as the unit runs it, with the stall command loaded, logging to a file."""

    def __init__(self, root: Path, redis: Redis, name: str) -> None:
        self.name, self.log = f"{name}@{socket.gethostname()}", root / f"{name}.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("LLMGW_")}
        env.update(
            LLMGW_REDIS_URL=redis.url,
            LLMGW_DATA_DIR=str(root / name),
            LLMGW_WORKER_DEAF_S="4",
            PYTHONUNBUFFERED="1",
            PYTHONPATH=os.pathsep.join(filter(None, [str(CHECKOUT), os.environ.get("PYTHONPATH")])),
        )
        cmd = [sys.executable, "-m", "celery", "-A", "llmgw", "worker", "--loglevel=WARNING", *WORKER_POOL]
        cmd += ["--without-gossip", "--without-mingle", "-n", self.name, "-I", "tests.core.stall_control"]
        with self.log.open("w") as out:
            self.proc = subprocess.Popen(cmd, env=env, cwd=CHECKOUT, stdout=out, stderr=subprocess.STDOUT)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait(self, timeout: float) -> int:
        """Its exit status; a timeout says what its log ends with."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"{self.name} still running after {timeout} s; its log ends:\n{tail(self.text())}"
            ) from None

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)


@pytest.fixture
def celery_app(tmp_path):
    """A Celery app of the test's on its own Redis, to queue tasks by name and send control commands."""
    redis = Redis(tmp_path)
    app = Celery("probe", broker=redis.url, set_as_current=False)
    workers: list[Worker] = []

    def start(name: str) -> Worker:
        worker = Worker(tmp_path, redis, name)
        workers.append(worker)
        # Up once it answers a ping and takes a task from its queue (an unregistered one, named in its log).
        wait_until(lambda: app.control.ping(destination=[worker.name], timeout=1), 60, f"{name} answering")
        probe = f"probe.{name}"
        app.send_task(probe)
        wait_until(lambda: f"'{probe}'" in worker.text(), 30, f"{name} taking a task")
        return worker

    yield app, redis, start
    for worker in workers:
        worker.close()
    if redis.proc.poll() is None:
        redis.stop()
    app.close()


QUIET = "This worker is quiet:"


def tail(text: str, lines: int = 40) -> str:
    """A worker log's last lines, without the unregistered tasks' reports (each is a dozen lines)."""
    kept = [line for line in text.splitlines() if line.strip() and not line.startswith((" ", "\t"))]
    return "\n".join(kept[-lines:])


@pytest.mark.slow
def test_a_worker_deaf_to_its_queues_exits_and_says_why(celery_app):
    """Deaf to both its queues, the shared one and its own, as a consumer that lost track of its connection is."""
    app, _, start = celery_app
    worker = start("deaf")
    for queue in ("celery", worker_direct(worker.name).name):
        app.control.cancel_consumer(queue, destination=[worker.name], reply=True, timeout=5)
    # Judged a reconnect's longest wait (30 s) after Redis first answered, and a window (4 s) after that.
    worker.wait(90)
    text = worker.text()
    assert QUIET in text and "a task sent to it alone has waited" in text, tail(text)
    assert "Thread 0x" in text and "Current thread" in text, "every thread's stack is in the log"
    # A warm shutdown: the worker's own, not the hard exit.
    assert worker.proc.returncode != worker_guard.STUCK_EXIT_STATUS


@pytest.mark.slow
def test_a_worker_deaf_only_to_the_shared_queue_is_not_judged(celery_app):
    """Another worker may take every task of the shared queue: only its own queue says it is deaf."""
    app, _, start = celery_app
    worker = start("half")
    app.control.cancel_consumer("celery", destination=[worker.name], reply=True, timeout=5)
    time.sleep(40)
    assert worker.proc.poll() is None and QUIET not in worker.text(), tail(worker.text())


@pytest.mark.slow
def test_a_worker_whose_main_thread_is_stuck_exits_at_once(celery_app):
    app, _, start = celery_app
    worker = start("stuck")
    app.control.broadcast("llmgw_test_stall", arguments={"seconds": 120}, destination=[worker.name])
    started = time.monotonic()
    # Judged a reconnect's longest wait (30 s) after Redis first answered, and a window (4 s) after that.
    worker.wait(90)
    text = worker.text()
    assert worker.proc.returncode == worker_guard.STUCK_EXIT_STATUS, tail(text)
    assert QUIET in text and "its event loop has not turned" in text
    assert "llmgw_test_stall" in text, "the stuck thread's stack names where it was"
    assert time.monotonic() - started < 80


@pytest.mark.slow
def test_a_busy_worker_and_one_whose_redis_is_gone_stay(celery_app):
    app, redis, start = celery_app
    busy = start("busy")
    # Tasks all along for three windows: each received at once (unregistered, so done as soon as received).
    deadline = time.monotonic() + 12
    while time.monotonic() < deadline:
        app.send_task("steady")
        time.sleep(0.2)
    assert busy.proc.poll() is None and QUIET not in busy.text()
    # Redis away for three windows: the consumer is in its reconnect loop, the loop does not turn. It retries
    # 2, 4, 6 and 8 s apart: away 13 s, it comes back at its fourth retry, 20 s after it lost Redis, more than a
    # window after Redis answered again, with its loop's last turn older still (the case not to take for a stall).
    redis.stop()
    lost = time.monotonic()
    time.sleep(13)
    redis.start()
    back = time.monotonic()
    probe = "after.outage"
    try:
        wait_until(lambda: app.send_task(probe) and f"'{probe}'" in busy.text(), 60, "the worker taking tasks", 0.5)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; alive: {busy.proc.poll() is None}; its log ends:\n{tail(busy.text())}") from None
    taking = time.monotonic()
    assert taking - back > 4, f"the worker was back {taking - back:.1f} s after Redis: the case is not covered"
    time.sleep(6)
    assert busy.proc.poll() is None and QUIET not in busy.text(), busy.text()[-3000:]
    assert taking - lost < 40


@settings(max_examples=50)
@given(st.floats(0.2, 3.0), st.floats(0.0, 20.0))
def test_a_worker_that_went_deaf_after_taking_tasks_is_named(gap, went_deaf):
    """Its canaries waited all along, as each look sends one: what counts is the wait since the last it took
    (the CI run of 6ecaac7 found the wait counted from the first look, so one taken canary put it off for ever)."""
    watch, now, why = WorkerWatch(WINDOW, RECONNECT), 0.0, None
    while now < went_deaf + 3 * (WINDOW + RECONNECT) and why is None:
        now += gap
        received = now if now < went_deaf else max(went_deaf - gap, 0.0)
        why = watch.look(Seen(now, True, 1, True, now, received))
    assert why is not None and why.startswith("a task sent to it alone")
    assert now < max(went_deaf, RECONNECT) + WINDOW + 2 * gap + 0.01


@pytest.mark.slow
def test_a_task_waits_in_redis_not_in_a_busy_worker_so_its_death_loses_nothing(celery_app, tmp_path):
    """With both its pool's threads busy a worker takes nothing more from Redis (worker_disable_prefetch): a task
    queued meanwhile stays in the queue, where another worker takes it the moment the first one dies. Taken
    early, it would wait in the dead worker's memory and in Redis's unacked set until the visibility timeout
    (300 s). And a worker that is busy for longer than its window with its canaries waiting is not deaf."""
    app, redis, start = celery_app
    first = start("first")
    held = [tmp_path / f"held{i}" for i in range(2)]
    for path in held:
        app.send_task("llmgw_test.hold", args=[45.0, str(path)])
    wait_until(lambda: all(p.exists() for p in held), 30, "both the pool's threads busy")
    app.send_task("queued.meanwhile")
    client = redis_client(redis)
    # A reconnect's longest wait (30 s) and a window (4 s) with canaries waiting: a deaf verdict would have come.
    deadline = time.monotonic() + 38
    while time.monotonic() < deadline:
        assert "'queued.meanwhile'" not in first.text(), "the busy worker took the task"
        assert first.proc.poll() is None, f"the busy worker exited: {tail(first.text())}"
        time.sleep(1)
    assert QUIET not in first.text()
    # The two being run were acknowledged as they started; the third is in the queue, not taken.
    assert (client.llen("celery"), client.hlen("unacked")) == (1, 0)
    first.proc.send_signal(signal.SIGKILL)
    first.proc.wait(10)
    second = start("second")
    wait_until(lambda: "'queued.meanwhile'" in second.text(), 30, "the other worker taking the queued task")


def redis_client(redis: Redis):
    import redis as redis_py

    return redis_py.Redis(port=redis.port)
