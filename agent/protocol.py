"""The agent protocol's shared facts: paths, intervals, and the report digest.

Django-free so both sides use it: the agent to tell whether its report
changed, the control plane to tell whether what it holds is current.
"""

from __future__ import annotations

import hashlib
import json

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

# The InfiniBand error counters the fabric analysis reads (inventory.fabrics.ERROR_COUNTERS, in
# sysfs spelling, and perfquery's): they are kept in the digest, so a report whose only news is
# a rising error count is stored, and "errors rising" can be told. tests/inventory/test_fabrics.py
# holds the two lists equal.
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
    body = json.dumps(stable, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(body.encode()).hexdigest()
