"""core.memory gives the allocator's free pages back, and a Celery process does so after each task."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from celery import shared_task

from core import memory

ROOT = Path(__file__).resolve().parents[2]

trims = pytest.mark.skipif(not memory.give_back(), reason="this C library has no malloc_trim")

# A heap left full of holes, as a fleet-wide task leaves it: 80 MB of 4 kB blocks (past pymalloc's 512
# bytes, so glibc's), every fiftieth and the last kept, so that the heap's top cannot shrink on its own.
FRAGMENTED = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {root!r})
    from core import memory

    def rss_mb():
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024

    blocks = [bytes(4000) for _ in range(20_000)]
    kept = blocks[::50] + blocks[-1:]
    del blocks
    before = rss_mb()
    {call}
    print(before, rss_mb())
    """
)


def rss_before_and_after(call: str) -> tuple[float, float]:
    code = FRAGMENTED.format(root=str(ROOT), call=call)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60).stdout
    before, after = map(float, out.split())
    return before, after


@trims
def test_the_freed_pages_of_a_heap_full_of_holes_go_back_to_the_system():
    before, after = rss_before_and_after("memory.give_back()")
    assert before - after > 40, (before, after)


@trims
def test_without_it_the_process_keeps_them():
    """The premise: glibc keeps a heap's holes by itself, so the test above measures the call."""
    before, after = rss_before_and_after("pass")
    assert before - after < 5, (before, after)


@shared_task(name="tests.core.test_memory.small_task")
def small_task() -> int:
    return 1


def test_a_celery_process_gives_memory_back_after_each_task(monkeypatch):
    given: list[bool] = []
    monkeypatch.setattr(memory, "give_back", lambda: given.append(True) or True)
    import llmgw.celery  # noqa: F401 -- its signal receivers

    assert small_task.apply().get() == 1
    assert small_task.apply().get() == 1
    assert len(given) == 2
