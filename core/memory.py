"""Giving the operating system back the memory a large piece of work freed.

A Celery process that has run one of the fleet-wide tasks frees what the
task read when it ends, but glibc's allocator keeps the pages of its heap
for the process's next allocation, and a few objects that outlive the task
(a cached plan, a connection's buffers) keep the heap from shrinking at its
top. When the minute's scan planning still read the whole fabric analysis
(75 MB of Python objects at its peak at 10,000 nodes), the process that ran
it stayed some 50 MB above its siblings (bench/scale.py prints each
process's memory).
``malloc_trim(0)`` hands back every free page of the heap, wherever it lies,
and costs a few milliseconds after such a task, less than one after a small
one.

Written by hand with ctypes: no library on PyPI wraps this one call. Elsewhere
than glibc (macOS, musl) there is no such call, and nothing is done.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from collections.abc import Callable


def _trimmer() -> Callable[[int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):  # a C library without it (musl)
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


_TRIM = _trimmer()


def give_back() -> bool:
    """Return the allocator's free pages to the operating system; False where the C library has no way to."""
    if _TRIM is None:
        return False
    _TRIM(0)
    return True
