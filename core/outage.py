"""One log line when a shared service goes, one when it is back, whoever in the process noticed.

Redis is used by several parts of one process (the gateway's rate limiter
and load publisher, the console's live updates, Celery's broker connection
in the worker, the beat and every caller queueing a task), each of which
already carries on without it. Left to themselves they each said so, at
every failed call or retry, many with a traceback: a 30 s outage wrote 36
kombu tracebacks. Here each service has one :class:`Outage` per process;
every part reports to it (:meth:`Outage.failed`, :meth:`Outage.back`) and
only a change of state is logged, as one line without a traceback.

Celery's and kombu's own messages about a lost broker are folded in by
:class:`BrokerLogFilter` (on the console handler, llmgw.settings.LOGGING):
they count as a failure of Redis and are not written.

No Django here: the settings' logging configuration names the filter.
"""

from __future__ import annotations

import logging
import os
import threading
import time

log = logging.getLogger("llmgw.outage")

REDIS = "Redis"


CONFIRM_S = 1.0
"""A service is down once calls have kept failing this long with none working between: one failure alone
(a connection the server closed while it was being reused, a read that timed out once) is not an outage."""


class Outage:
    """Whether one shared service is down in this process, and since when; logs only when that changes."""

    def __init__(self, service: str, while_down: str) -> None:
        self.service = service
        self.while_down = while_down
        self.lock = threading.Lock()
        self.failing_since: float | None = None
        self.down_since: float | None = None

    @property
    def down(self) -> bool:
        """Calls are failing (for callers to try once rather than retry); said in the log or not yet."""
        return self.failing_since is not None

    def failed(self, reason: BaseException | str) -> bool:
        """A call to the service failed; True when this is the one that found it down (and logged it)."""
        now = time.monotonic()
        with self.lock:
            if self.down_since is not None:
                return False
            if self.failing_since is None:
                self.failing_since = now
            if now - self.failing_since < CONFIRM_S:
                return False
            self.down_since = self.failing_since
        log.warning(
            "[pid %d] %s is unreachable (%s); %s. One line follows when it is back.",
            os.getpid(),
            self.service,
            why(reason),
            self.while_down,
        )
        return True

    def back(self) -> bool:
        """A call to the service worked; True when this is the one that found it back (and logged it)."""
        if self.failing_since is None:  # the usual case, read without the lock
            return False
        with self.lock:
            since, self.down_since, self.failing_since = self.down_since, None, None
        if since is None:
            return False
        log.warning("[pid %d] %s is back after %.0f s.", os.getpid(), self.service, time.monotonic() - since)
        return True


def why(reason: BaseException | str) -> str:
    """An exception's class and first line, short enough for one log line."""
    if isinstance(reason, BaseException):
        first = (str(reason).strip().splitlines() or [""])[0]
        return f"{type(reason).__name__}: {first[:200]}" if first else type(reason).__name__
    return reason.strip().splitlines()[0][:200] if reason.strip() else "no answer"


redis = Outage(
    REDIS,
    "rate limits count in the database, gateway load is written to the database, live pages pause, "
    "and queued tasks wait for it",
)
"""This process's view of Redis (LLMGW_REDIS_URL)."""
database = Outage(
    "The database",
    "heartbeats are kept in memory, the newest of each node, and written when it is back",
)
"""This process's view of PostgreSQL, as the heartbeat flusher sees it (a Patroni switchover or failover)."""

# Connection failures by the name of a class in their exception's MRO: kombu's OperationalError, redis-py's
# ConnectionError and TimeoutError, the builtin ConnectionError and OSError, without importing them here.
CONNECTION_ERRORS = frozenset({"OperationalError", "ConnectionError", "TimeoutError", "OSError"})
# Celery's and kombu's words for a broker it cannot reach (the consumer's and the beat's retry loops).
BROKER_WORDS = ("Cannot connect to", "Connection to broker lost", "Connection error", "connection refused")


def connection_error(error: BaseException | None) -> BaseException | None:
    """The connection failure ``error`` is or was raised from (the beat's SchedulingError wraps kombu's), if any."""
    seen = set()
    while error is not None and id(error) not in seen:
        if CONNECTION_ERRORS.intersection(c.__name__ for c in type(error).__mro__):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


class BrokerLogFilter(logging.Filter):
    """Folds Celery's and kombu's lost-broker messages into :data:`redis`, leaving every other record alone."""

    LOGGERS = ("celery", "kombu")

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith(self.LOGGERS):
            return True
        error = record.exc_info[1] if record.exc_info else None
        cause = connection_error(error)
        if cause is not None:
            redis.failed(cause)
            return False
        message = record.getMessage()
        if error is None and any(word.lower() in message.lower() for word in BROKER_WORDS):
            redis.failed(message.split(": ", 1)[-1])
            return False
        return True
