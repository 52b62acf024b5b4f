"""What every test starts from."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings

from tests import dbflush

# No test here is timed: an example's duration is the machine's load, not the code's (speed is bench/'s).
# Hypothesis's 200 ms deadline and its too-slow health check fail an example whenever the machine is busy.
settings.register_profile("llmgw", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("llmgw")

# A transactional test's teardown empties the tables while a live server of the test's may still write them.
dbflush.install()


@pytest.fixture(autouse=True)
def quiet_live_pages():
    """No live update held over from an earlier test (dashboard.live holds a window's updates for a moment).

    A held update's timer would otherwise send it into the next test's
    channel layer, where a test counting messages would hear a stranger.
    """
    from dashboard import live

    live.reset()
    yield
    live.reset()
