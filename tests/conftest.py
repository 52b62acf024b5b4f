"""What every test starts from."""

from __future__ import annotations

import pytest


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
