"""Holding off Python's cycle collector while a large read builds its answer.

A read of a whole large fleet (the node listing, the doctor sweep's load)
allocates hundreds of thousands of small dicts, tuples and lists, none of
them in a cycle. Each allocation burst sets off the collector, whose passes
over everything still alive grow with what the read has built so far: a
third of the node listing's time at 2,000 nodes. Reference counting still
frees all of it; the collector resumes (if it was on) as soon as the read is
built, whatever it raised.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def uncollected() -> Iterator[None]:
    """The cycle collector off for the block; back as it was after it."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()
