"""core.cycles: the collector is off inside the block and back as it was after it, whatever the block raised."""

from __future__ import annotations

import gc

import pytest

from core import cycles


@pytest.mark.parametrize("was_on", [True, False])
def test_the_collector_is_off_inside_and_as_it_was_after(was_on):
    (gc.enable if was_on else gc.disable)()
    try:
        with cycles.uncollected():
            assert not gc.isenabled()
        assert gc.isenabled() == was_on
        with pytest.raises(ZeroDivisionError), cycles.uncollected():
            1 / 0  # noqa: B018
        assert gc.isenabled() == was_on
    finally:
        gc.enable()
