"""The agent protocol's shared facts: paths, intervals, and the report digest.

Django-free so both sides use it: the agent to tell whether its report
changed, the control plane to tell whether what it holds is current.
"""

from __future__ import annotations

import hashlib
import json

import orjson

REGISTER_PATH = "/api/v1/agent/register"
REPORT_PATH = "/api/v1/agent/report"
HEARTBEAT_PATH = "/api/v1/agent/heartbeat"
SCAN_PATH = "/api/v1/agent/scan"


HEARTBEAT_INTERVAL_S = 5.0
REPORT_INTERVAL_S = 60.0

# A shard's start, as its heartbeat entry's ``phases`` reports it (agent/supervisor/supervisor.py):
# seconds per phase, and whether the weights were on the node already. A phase longer than a
# week is no reading: the supervisor gives an engine at most its start timeout.
PHASE_SECONDS = ("fetch_s", "load_s")
MAX_PHASE_S = 7 * 86400.0

# Readings that change at every report and say nothing about what the machine is.
VOLATILE_TOP = ("collected_at", "load")
VOLATILE_GPU = ("temperature_c", "power_w", "utilization_pct", "processes")

# The InfiniBand error counters the fabric analysis reads (inventory.fabrics.ERROR_COUNTERS, which
# is built from this list; in sysfs spelling here, and perfquery's too): they are kept in the
# digest, so a report whose only news is a rising error count is stored, and "errors rising" can
# be told.
ERROR_COUNTERS = (
    "symbol_error",
    "link_error_recovery",
    "link_downed",
    "port_rcv_errors",
    "port_rcv_remote_physical_errors",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
    "port_xmit_discards",
    "port_rcv_constraint_errors",
    "port_xmit_constraint_errors",
)
_ERROR_NAMES = {*ERROR_COUNTERS, *(name.replace("_", "") for name in ERROR_COUNTERS)}


def error_counters(counters: object) -> object:
    """Only the error counters of a port's ``counters`` (any other value is passed through as it is)."""
    if not isinstance(counters, dict):
        return counters
    return {k: v for k, v in counters.items() if _is_error_counter(k)}


def _is_error_counter(name: object) -> bool:
    spelled = str(name).lower()
    return spelled in _ERROR_NAMES or spelled.removesuffix("counter") in _ERROR_NAMES


def report_digest(report: dict) -> str:
    """SHA-256 of the report with its volatile readings left out.

    Traffic counters are left out too (they rise all the time); error
    counters are kept, so the report that brings a new error count is stored.
    """
    stable = {k: v for k, v in report.items() if k not in VOLATILE_TOP}
    if isinstance(stable.get("gpus"), list):
        stable["gpus"] = [
            {k: v for k, v in g.items() if k not in VOLATILE_GPU} if isinstance(g, dict) else g for g in stable["gpus"]
        ]
    if isinstance(stable.get("ib_ports"), list):
        stable["ib_ports"] = [
            {k: (error_counters(v) if k == "counters" else v) for k, v in p.items()} if isinstance(p, dict) else p
            for p in stable["ib_ports"]
        ]
    return hashlib.sha256(stable_text(stable)).hexdigest()


# orjson writes these as json does not: NaN and infinity as null (json: NaN), and a float between
# 1e-9 and 1e-4 in size without an exponent (0.0000999; json: 9.99e-05) or with one of a single
# digit (1.5e-7; json: 1.5e-07); and DEL as it is, which json escapes (\\u007f).
_UNLIKE_JSON = (b"null", b"0.0000", b"\x7f")
_ORJSON_SORTED = orjson.OPT_SORT_KEYS | orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS
_DIGITS = frozenset(b"0123456789")


def _short_exponent(text: bytes) -> bool:
    """Whether a number in ``text`` has an exponent of one digit below zero (``1.5e-7``).

    Found by looking at each ``e-`` (bytes.find, where a regular expression
    took longer than the encoding): a digit before it, one digit and no more
    after it, and a number's start before those digits (after ``:``, ``,``,
    ``[`` or nothing), so "161e-5" inside a UUID ("-b704-161e-5ebe-") is not
    taken for one.
    """
    at = text.find(b"e-")
    while at != -1:
        after = text[at + 2 : at + 4]
        if at and text[at - 1] in _DIGITS and after[:1].isdigit() and not after[1:].isdigit():
            start = at
            while start and (text[start - 1] in _DIGITS or text[start - 1] == ord(".")):
                start -= 1
            if start and text[start - 1] == ord("-"):
                start -= 1
            if not start or text[start - 1] in b":,[":
                return True
        at = text.find(b"e-", at + 2)
    return False


def stable_text(value: object) -> bytes:
    """``json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)``, encoded: what a digest is of.

    The digest must not change with the version that computes it (the
    server compares one it stored with one it computes now), so the text is
    json's, byte for byte. orjson writes it in a fifth of the time (a 12 KB
    report's digest, on every registration and full report: 124 -> 69 us) and
    the same bytes whenever its text is ASCII (json escapes everything else)
    and holds neither a null nor a float it writes its own way; any other
    value, or one orjson refuses (an int past 64 bits, a key that is not a
    string), is json's to write. Held to json's text over any JSON value,
    datetimes and other types given to ``str`` (tests/agent/test_digest.py).
    """
    try:
        fast = orjson.dumps(value, default=str, option=_ORJSON_SORTED)
    except TypeError:  # orjson.JSONEncodeError is one
        fast = None
    if fast is not None and fast.isascii() and not any(m in fast for m in _UNLIKE_JSON) and not _short_exponent(fast):
        return fast
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str).encode()
