"""One live server for the whole suite, and its totals printed at the end of the run."""

from __future__ import annotations

import pytest

from tests.hostile.fleet import Hostile
from tests.hostile.probe import TALLIES


@pytest.fixture(scope="session")
def hostile(tmp_path_factory):
    world = Hostile(tmp_path_factory.mktemp("hostile"))
    try:
        world.start()
        yield world
    finally:
        world.stop()


def pytest_terminal_summary(terminalreporter):
    if not TALLIES:
        return
    terminalreporter.section("hostile-input suite")
    for t in TALLIES.values():
        terminalreporter.write_line(t.line())
