"""core.outage: one line when a service goes, one when it is back, and Celery's retries folded in."""

from __future__ import annotations

import logging
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core import outage


@pytest.fixture
def clock(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(outage.time, "monotonic", lambda: now[0])
    return now


def lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "llmgw.outage"]


def test_one_line_when_it_goes_and_one_when_it_is_back(clock, caplog):
    redis = outage.Outage("Redis", "rate limits count in the database")
    with caplog.at_level(logging.WARNING, "llmgw.outage"):
        assert not redis.failed(ConnectionRefusedError(111, "Connection refused"))
        assert redis.down and not lines(caplog), "one failure is not yet an outage"
        for _ in range(30):
            clock[0] += 0.5
            redis.failed(ConnectionRefusedError(111, "Connection refused"))
        clock[0] += 10
        assert redis.back()
        assert not redis.back() and not redis.down
    went, back = lines(caplog)
    assert "Redis is unreachable (ConnectionRefusedError: [Errno 111] Connection refused)" in went
    assert "rate limits count in the database" in went
    assert back.endswith("Redis is back after 25 s.")


def test_a_failure_that_heals_at_once_says_nothing(clock, caplog):
    redis = outage.Outage("Redis", "")
    with caplog.at_level(logging.WARNING, "llmgw.outage"):
        redis.failed(TimeoutError("Timeout reading from 127.0.0.1:6379"))
        clock[0] += 0.2
        redis.failed(TimeoutError("Timeout reading from 127.0.0.1:6379"))
        assert not redis.back()
    assert not lines(caplog) and not redis.down


@given(st.lists(st.tuples(st.booleans(), st.floats(0, 5)), max_size=60))
def test_lines_alternate_went_and_back(calls):
    """Whatever the calls, the log says went, back, went, back…: never twice the same in a row."""
    now = [0.0]
    redis = outage.Outage("Redis", "")
    said = []
    for ok, wait in calls:
        now[0] += wait
        outage.time.monotonic, saved = (lambda: now[0]), outage.time.monotonic
        try:
            if redis.back() if ok else redis.failed("refused"):
                said.append(ok)
        finally:
            outage.time.monotonic = saved
    assert said == [bool(i % 2) for i in range(len(said))]


def record(name: str, message: str, error: BaseException | None = None) -> logging.LogRecord:
    exc_info = None
    if error is not None:
        try:
            raise error
        except BaseException:  # noqa: BLE001 - any error, as a logger is handed it
            exc_info = sys.exc_info()
    return logging.LogRecord(name, logging.ERROR, __file__, 1, message, (), exc_info)


def scheduling_error() -> BaseException:
    """What the beat logs: its SchedulingError raised while handling kombu's OperationalError."""

    class OperationalError(Exception):
        pass

    class SchedulingError(Exception):
        pass

    try:
        try:
            raise OperationalError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")
        except OperationalError as exc:
            raise SchedulingError("Couldn't apply scheduled task tick") from exc
    except SchedulingError as exc:
        return exc


@pytest.mark.parametrize(
    "made",
    [
        lambda: record("celery.beat", "Message Error: %s", scheduling_error()),
        lambda: record("celery.worker.consumer.consumer", "consumer: Cannot connect to redis://x:1/0: Error 111."),
        lambda: record("celery.worker.consumer.consumer", "consumer: Connection to broker lost. Trying again..."),
        lambda: record("kombu.connection", "retry", ConnectionRefusedError(111, "Connection refused")),
    ],
)
def test_celery_and_kombu_lost_broker_records_are_folded(made, monkeypatch):
    redis = outage.Outage("Redis", "")
    monkeypatch.setattr(outage, "redis", redis)
    assert outage.BrokerLogFilter().filter(made()) is False
    assert redis.down


@pytest.mark.parametrize(
    "made",
    [
        lambda: record("celery.app.trace", "Task failed", ValueError("a bug")),
        lambda: record("llmgw.gateway", "Cannot connect to the engine", ConnectionRefusedError(111, "refused")),
        lambda: record("celery.worker", "Task placement.tasks.reconcile raised"),
    ],
)
def test_other_records_are_left_alone(made, monkeypatch):
    redis = outage.Outage("Redis", "")
    monkeypatch.setattr(outage, "redis", redis)
    assert outage.BrokerLogFilter().filter(made()) is True
    assert not redis.down
