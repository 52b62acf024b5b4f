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

# Readings that change at every report and say nothing about what the machine is.
VOLATILE_TOP = ("collected_at", "load")
VOLATILE_GPU = ("temperature_c", "power_w", "utilization_pct", "processes")


def report_digest(report: dict) -> str:
    """SHA-256 of the report with its volatile readings left out.

    Traffic and error counters are left out too: they rise all the time, and
    the fabric analysis compares error counters on its own.
    """
    stable = {k: v for k, v in report.items() if k not in VOLATILE_TOP}
    if isinstance(stable.get("gpus"), list):
        stable["gpus"] = [
            {k: v for k, v in g.items() if k not in VOLATILE_GPU} if isinstance(g, dict) else g for g in stable["gpus"]
        ]
    if isinstance(stable.get("ib_ports"), list):
        stable["ib_ports"] = [
            {k: v for k, v in p.items() if k != "counters"} if isinstance(p, dict) else p for p in stable["ib_ports"]
        ]
    body = json.dumps(stable, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(body.encode()).hexdigest()
