"""Sizes and sentences the agent endpoints share (the Django views, the fast lane): their refusals read the same."""

from __future__ import annotations

REPORT_LIMIT = 2 * 1024 * 1024
HEARTBEAT_LIMIT = 256 * 1024
SEND_BEARER = "send the credential as 'Authorization: Bearer <token>'"
REVOKED = "this node credential is unknown or was revoked; register again with a join token"
USE_POST = "send heartbeats with POST"


def too_large(length: int | None, limit: int) -> str:
    if length is None:
        return f"the body is over {limit} bytes, the most accepted here"
    return f"the body is {length} bytes; at most {limit} are accepted here"


def too_soon(interval_s: float, wait_s: int) -> str:
    return (
        f"this node's last full report was taken less than {interval_s:g} s ago, and one is taken at most every "
        f"{interval_s:g} s: send it again in {wait_s} s"
    )
