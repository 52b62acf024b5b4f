"""What the child processes of ``llmgw serve`` share: they never outlive it."""

from __future__ import annotations

import contextlib
import ctypes
import signal

PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Ask Linux to send SIGTERM to this child if its parent dies first (``preexec_fn``).

    Elsewhere the call is not there and nothing is asked: stopping llmgw
    serve stops its children anyway; only a parent killed outright leaves
    them running.
    """
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
