"""What a node's report must look like before anything in it is stored.

Pure: a dict in, a list of problems out (empty means acceptable). Checks are
about shape and type — the control plane never trusts a number's sign or a
list's length just because an agent sent it — and every problem names the
path of the value at fault, so an agent author knows what to fix.

Absent keys are allowed everywhere: an older agent that does not know a field
leaves it out, and that means *unknown*.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

MAX_GPUS = 2048
MAX_PORTS = 512
MAX_PROBLEMS_REPORTED = 10
MIG_INDEX_BASE = 1000

Check = Callable[[Any], bool]


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _nonneg_int(v: Any) -> bool:
    return _is_int(v) and v >= 0


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _str(v: Any) -> bool:
    return isinstance(v, str) and len(v) <= 4096


def _str_list(v: Any) -> bool:
    return isinstance(v, list) and all(_str(x) for x in v)


def _int_list(v: Any) -> bool:
    return isinstance(v, list) and all(_is_int(x) for x in v)


def _str_map(v: Any) -> bool:
    return isinstance(v, dict) and all(_str(k) and _str(x) for k, x in v.items())


def _bool(v: Any) -> bool:
    return isinstance(v, bool)


def _dict(v: Any) -> bool:
    return isinstance(v, dict)


def _list(v: Any) -> bool:
    return isinstance(v, list)


def _nullable(check: Check) -> Check:
    return lambda v: v is None or check(v)


GPU_FIELDS: dict[str, tuple[Check, str]] = {
    "index": (_nonneg_int, "a non-negative integer"),
    "uuid": (_str, "a string"),
    "name": (_str, "a string"),
    "class": (_str, "a string"),
    "memory_mb": (_nonneg_int, "a non-negative integer"),
    "pci_bus": (_str, "a string"),
    "numa": (_nullable(_is_int), "an integer"),
    "nvlink_peers": (_int_list, "a list of integers"),
    "nics": (_str_map, "an object of adapter → nearness strings"),
    "health": (_str_list, "a list of strings"),
    "fabric": (_dict, "an object"),
    "mig_mode": (_str, "a string"),
    "parent": (_nonneg_int, "a non-negative integer"),
    "mig_uuid": (_str, "a string"),
    "mig_profile": (_str, "a string"),
}
FABRIC_FIELDS: dict[str, tuple[Check, str]] = {
    "state": (_str, "a string"),
    "status": (_str, "a string"),
    "cluster_uuid": (_str, "a string"),
    "clique_id": (_nullable(_nonneg_int), "a non-negative integer"),
    "health_summary": (_str, "a string"),
    "bandwidth": (_str, "a string"),
    "degraded": (_nullable(_bool), "true or false"),
    "problems": (_str_list, "a list of strings"),
}
PORT_FIELDS: dict[str, tuple[Check, str]] = {
    "hca": (_str, "a string"),
    "port": (_nonneg_int, "a non-negative integer"),
    "state": (_str, "a string"),
    "phys_state": (_str, "a string"),
    "rate_gbps": (_nullable(lambda v: _number(v) and v >= 0), "a non-negative number"),
    "link_layer": (_str, "a string"),
    "node_guid": (_str, "a string"),
    "port_guid": (_str, "a string"),
    "sm_lid": (_nullable(_nonneg_int), "a non-negative integer"),
    "sm_guid": (_nullable(_str), "a string"),
    "sm_error": (_nullable(_str), "a string"),
    "network": (_nullable(_str), "a string"),
    "fabric": (_nullable(_str), "a string"),
    "counters": (
        lambda v: isinstance(v, dict) and all(_str(k) and _number(x) for k, x in v.items()),
        "an object of counter → number",
    ),
}
TOP_FIELDS: dict[str, tuple[Check, str]] = {
    "agent_version": (_str, "a string"),
    "hostname": (_str, "a string"),
    "gpus": (_list, "a list"),
    "ib_ports": (_list, "a list"),
    "host": (_dict, "an object"),
    "imex": (_dict, "an object"),
    "load": (_dict, "an object"),
    "disks": (_list, "a list"),
    "engines": (_str_map, "an object of engine → version"),
    "weights": (_list, "a list"),
    "fabrics": (
        lambda v: isinstance(v, dict) and all(_str(k) and _str_list(x) for k, x in v.items()),
        "an object of fabric name → adapters",
    ),
    "problems": (_str_list, "a list of strings"),
}


def _fields(obj: dict, spec: dict[str, tuple[Check, str]], where: str, out: list[str]) -> None:
    for key, (check, wanted) in spec.items():
        if key in obj and not check(obj[key]):
            out.append(f"{where}.{key} must be {wanted}, not {type(obj[key]).__name__} {_short(obj[key])}")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _gpus(gpus: list, out: list[str]) -> None:
    if len(gpus) > MAX_GPUS:
        out.append(f"gpus has {len(gpus)} entries; at most {MAX_GPUS} are accepted")
        return
    seen: set[int] = set()
    for i, gpu in enumerate(gpus):
        where = f"gpus[{i}]"
        if not isinstance(gpu, dict):
            out.append(f"{where} must be an object")
            continue
        for key in ("index", "uuid", "name", "class"):
            if key not in gpu:
                out.append(f"{where} has no {key}")
        _fields(gpu, GPU_FIELDS, where, out)
        if isinstance(gpu.get("fabric"), dict):
            _fields(gpu["fabric"], FABRIC_FIELDS, f"{where}.fabric", out)
        index = gpu.get("index")
        if _nonneg_int(index):
            if index in seen:
                out.append(f"{where}.index {index} appears twice")
            seen.add(index)
            is_instance = "parent" in gpu
            if is_instance != (index >= MIG_INDEX_BASE):
                out.append(
                    f"{where}: a MIG instance has a parent and an index of {MIG_INDEX_BASE} or more; a card has neither"
                )


def _ports(ports: list, out: list[str]) -> None:
    if len(ports) > MAX_PORTS:
        out.append(f"ib_ports has {len(ports)} entries; at most {MAX_PORTS} are accepted")
        return
    seen: set[tuple] = set()
    for i, port in enumerate(ports):
        where = f"ib_ports[{i}]"
        if not isinstance(port, dict):
            out.append(f"{where} must be an object")
            continue
        for key in ("hca", "port"):
            if key not in port:
                out.append(f"{where} has no {key}")
        _fields(port, PORT_FIELDS, where, out)
        key = (port.get("hca"), port.get("port"))
        if key in seen:
            out.append(f"{where}: {key[0]} port {key[1]} appears twice")
        seen.add(key)


def report_problems(report: Any) -> list[str]:
    """Everything wrong with a full report; at most a few are returned, the first first."""
    if not isinstance(report, dict):
        return ["the report must be a JSON object"]
    out: list[str] = []
    _fields(report, TOP_FIELDS, "report", out)
    if isinstance(report.get("gpus"), list):
        _gpus(report["gpus"], out)
    if isinstance(report.get("ib_ports"), list):
        _ports(report["ib_ports"], out)
    host = report.get("host")
    if isinstance(host, dict):
        if "memory_mb" in host and not _nullable(_nonneg_int)(host["memory_mb"]):
            out.append("report.host.memory_mb must be a non-negative integer")
        if "cpu_flags" in host and not _str_list(host["cpu_flags"]):
            out.append("report.host.cpu_flags must be a list of strings")
    return out[:MAX_PROBLEMS_REPORTED]


def heartbeat_problems(beat: Any) -> list[str]:
    if not isinstance(beat, dict):
        return ["the heartbeat must be a JSON object"]
    out: list[str] = []
    if "load" in beat and not _nullable(_dict)(beat["load"]):
        out.append("heartbeat.load must be an object")
    if "shards" in beat:
        shards = beat["shards"]
        if not isinstance(shards, list) or not all(isinstance(s, dict) for s in shards):
            out.append("heartbeat.shards must be a list of objects")
        elif len(shards) > 256:
            out.append("heartbeat.shards has more than 256 entries")
    if "collected" in beat:
        done = beat["collected"]
        if not isinstance(done, list) or not all(isinstance(d, dict) and _str(d.get("path")) for d in done):
            out.append("heartbeat.collected must be a list of objects with the path that was deleted")
    if "report_digest" in beat and not _str(beat["report_digest"]):
        out.append("heartbeat.report_digest must be a string")
    return out[:MAX_PROBLEMS_REPORTED]
