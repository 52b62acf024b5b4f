"""What a node's report must look like before anything in it is stored.

Pure: a dict in, a list of problems out (empty means acceptable). Checks are
about shape and type — the control plane never trusts a number's sign or a
list's length just because an agent sent it — and every problem names the
path of the value at fault, so an agent author knows what to fix.

Absent keys are allowed everywhere: an older agent that does not know a field
leaves it out, and that means *unknown*.

Two more rules keep one bad value from failing the write (a 500, which the
agent takes for "unreachable"):

- every value must be storable at all: no NUL and no lone surrogate in any
  string or key (PostgreSQL text and jsonb refuse both), no NaN or infinity
  (jsonb has no spelling for them);
- every value that lands in a column must fit it. The limits (a string's
  length, an integer's range) are not written here: they are read from the
  Django models by ``inventory.bounds`` and passed in as ``bounds``, so a
  column made narrower cannot leave the schema behind. This module stays pure;
  the table is plain data keyed by the value's path.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from agent.protocol import MAX_PHASE_S, PHASE_SECONDS
from core import storable
from inventory.devices import MIG_INDEX_BASE

MAX_GPUS = 2048
MAX_PORTS = 512
MAX_PROBLEMS_REPORTED = 10
# An error counter is stored in JSON but compared and summed as a 64-bit integer: a value past
# that is no reading (the drivers' counters are 32- or 64-bit unsigned).
MAX_COUNTER = 2**63 - 1

Check = Callable[[Any], bool]
# A string's most characters, or an integer's (lowest, highest).
Limit = int | tuple[int, int]
# Path of a value → the limit of the column it lands in. Paths read like the
# problems do, with ``[]`` for any list item: "gpus[].memory_mb", "host.os",
# "fabrics{}" for the keys of an object.
Bounds = Mapping[str, Limit]


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


def _counter(v: Any) -> bool:
    return _is_int(v) and 0 <= v <= MAX_COUNTER


_COUNT = (_counter, f"a non-negative integer of at most {MAX_COUNTER}")


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
    "ecc": (_dict, "an object"),
    "remapped_rows": (_dict, "an object"),
    "retired_pages": (_dict, "an object"),
    "xids": (_list, "a list of objects"),
}
# Recent Xid events of a card (agent.discovery.xids): the code, when (Unix seconds), the driver's words.
MAX_XIDS = 32
XID_FIELDS: dict[str, tuple[Check, str]] = {
    "code": _COUNT,
    "at": (_number, "a number (Unix seconds)"),
    "message": (_str, "a string"),
}
# Memory health (agent.discovery.gpus.memory_health): counters the driver keeps.
ECC_COUNTER_FIELDS: dict[str, tuple[Check, str]] = {
    name: _COUNT for name in ("sram_correctable", "sram_uncorrectable", "dram_correctable", "dram_uncorrectable")
}
ECC_FIELDS: dict[str, tuple[Check, str]] = {
    "volatile": (_dict, "an object of counter → count"),
    "aggregate": (_dict, "an object of counter → count"),
    "sram_threshold_exceeded": (_bool, "true or false"),
}
REMAP_FIELDS: dict[str, tuple[Check, str]] = {
    "correctable": _COUNT,
    "uncorrectable": _COUNT,
    "pending": (_bool, "true or false"),
    "failure": (_bool, "true or false"),
    "bank_availability": (_dict, "an object of bucket → banks"),
}
BANK_FIELDS: dict[str, tuple[Check, str]] = {name: _COUNT for name in ("max", "high", "partial", "low", "none")}
RETIRED_FIELDS: dict[str, tuple[Check, str]] = {
    "single_bit": _COUNT,
    "double_bit": _COUNT,
    "pending": (_bool, "true or false"),
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
    "address": (_str, "a string"),
}
HOST_FIELDS: dict[str, tuple[Check, str]] = {
    "hostname": (_str, "a string"),
    "os": (_str, "a string"),
    "os_version": (_str, "a string"),
    "arch": (_str, "a string"),
    "memory_mb": (_nullable(_nonneg_int), "a non-negative integer"),
    "cpu_flags": (_str_list, "a list of strings"),
}
IMEX_FIELDS: dict[str, tuple[Check, str]] = {"state": (_str, "a string")}


def _fields(
    obj: dict, spec: dict[str, tuple[Check, str]], where: str, pattern: str, bounds: Bounds, out: list[str]
) -> None:
    """Check ``obj``'s known keys for type, then against the column each lands in (``pattern.key`` in ``bounds``)."""
    for key, (check, wanted) in spec.items():
        if key not in obj:
            continue
        value = obj[key]
        if not check(value):
            out.append(f"{where}.{key} must be {wanted}, not {type(value).__name__} {_short(value)}")
            continue
        limit = bounds.get(f"{pattern}.{key}" if pattern else key)
        if limit is not None and value is not None:
            problem = _beyond(value, limit)
            if problem:
                out.append(f"{where}.{key}: {problem}")


def _beyond(value: Any, limit: Limit) -> str | None:
    """Why ``value`` does not fit a column of this limit, or None when it does."""
    if isinstance(limit, int):
        if isinstance(value, str) and len(value) > limit:
            return f"{_short(value)} is {len(value)} characters; the column holds {limit}"
        return None
    low, high = limit
    if _is_int(value) and value > high:
        return f"{value} is more than the column holds ({high})"
    if _is_int(value) and value < low:
        return f"{value} is less than the column holds ({low})"
    return None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def unstorable(value: Any, where: str, out: list[str]) -> None:
    """Add a problem for each string, key or number in ``value`` that no column can hold (core.storable's rule)."""
    for problem in storable.problems(value, where):
        if len(out) >= MAX_PROBLEMS_REPORTED:
            return
        if problem.kind == storable.NOT_FINITE:
            out.append(f"{problem.path}: {problem.value} is not a number that can be stored")
            continue
        holds = f"{_short(problem.value)} holds {_TEXT_PROBLEMS[problem.kind]}, which cannot be stored"
        out.append(f"{problem.path}: a key {holds}" if problem.key else f"{problem.path}: {holds}")


_TEXT_PROBLEMS = {storable.NUL: "a NUL character", storable.SURROGATE: "a lone surrogate (not UTF-8)"}


def _gpus(gpus: list, bounds: Bounds, out: list[str]) -> None:
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
        _fields(gpu, GPU_FIELDS, where, "gpus[]", bounds, out)
        if isinstance(gpu.get("fabric"), dict):
            _fields(gpu["fabric"], FABRIC_FIELDS, f"{where}.fabric", "gpus[].fabric", bounds, out)
        _memory_health(gpu, where, bounds, out)
        _xids(gpu, where, bounds, out)
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


def _xids(gpu: dict, where: str, bounds: Bounds, out: list[str]) -> None:
    """A card's recent Xid events: at most MAX_XIDS, each an object of code, time and words."""
    xids = gpu.get("xids")
    if not isinstance(xids, list):
        return
    if len(xids) > MAX_XIDS:
        out.append(f"{where}.xids has {len(xids)} entries; at most {MAX_XIDS} are accepted")
        return
    for i, xid in enumerate(xids):
        if not isinstance(xid, dict):
            out.append(f"{where}.xids[{i}] must be an object")
            continue
        for key in ("code", "at"):
            if key not in xid:
                out.append(f"{where}.xids[{i}] has no {key}")
        _fields(xid, XID_FIELDS, f"{where}.xids[{i}]", "gpus[].xids[]", bounds, out)


def _memory_health(gpu: dict, where: str, bounds: Bounds, out: list[str]) -> None:
    """The nested objects of a card's ecc, remapped_rows and retired_pages."""
    ecc = gpu.get("ecc")
    if isinstance(ecc, dict):
        _fields(ecc, ECC_FIELDS, f"{where}.ecc", "gpus[].ecc", bounds, out)
        for section in ("volatile", "aggregate"):
            if isinstance(ecc.get(section), dict):
                _fields(ecc[section], ECC_COUNTER_FIELDS, f"{where}.ecc.{section}", "", bounds, out)
    remap = gpu.get("remapped_rows")
    if isinstance(remap, dict):
        _fields(remap, REMAP_FIELDS, f"{where}.remapped_rows", "gpus[].remapped_rows", bounds, out)
        if isinstance(remap.get("bank_availability"), dict):
            _fields(
                remap["bank_availability"], BANK_FIELDS, f"{where}.remapped_rows.bank_availability", "", bounds, out
            )
    if isinstance(gpu.get("retired_pages"), dict):
        _fields(gpu["retired_pages"], RETIRED_FIELDS, f"{where}.retired_pages", "gpus[].retired_pages", bounds, out)


def _ports(ports: list, bounds: Bounds, out: list[str]) -> None:
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
        _fields(port, PORT_FIELDS, where, "ib_ports[]", bounds, out)
        key = (port.get("hca"), port.get("port"))
        if not (isinstance(key[0], str) and _is_int(key[1])):
            continue  # already refused above; and a list is no key to compare
        if key in seen:
            out.append(f"{where}: {key[0]} port {key[1]} appears twice")
        seen.add(key)


def _keys(obj: Any, where: str, limit: Limit | None, out: list[str]) -> None:
    """An object whose keys land in a column (a declared fabric's name)."""
    if not isinstance(obj, dict) or limit is None:
        return
    for key in obj:
        problem = _beyond(key, limit) if isinstance(key, str) else None
        if problem:
            out.append(f"{where}: a name {problem}")


def report_problems(report: Any, bounds: Bounds) -> list[str]:
    """Everything wrong with a full report; at most a few are returned, the first first.

    ``bounds`` is the column table (see the module's docstring); the control
    plane passes ``inventory.bounds.report_bounds()``.
    """
    if not isinstance(report, dict):
        return ["the report must be a JSON object"]
    out: list[str] = []
    unstorable(report, "report", out)
    if out:
        return out[:MAX_PROBLEMS_REPORTED]
    _fields(report, TOP_FIELDS, "report", "", bounds, out)
    if isinstance(report.get("gpus"), list):
        _gpus(report["gpus"], bounds, out)
    if isinstance(report.get("ib_ports"), list):
        _ports(report["ib_ports"], bounds, out)
    if isinstance(report.get("host"), dict):
        _fields(report["host"], HOST_FIELDS, "report.host", "host", bounds, out)
    if isinstance(report.get("imex"), dict):
        _fields(report["imex"], IMEX_FIELDS, "report.imex", "imex", bounds, out)
    _keys(report.get("fabrics"), "report.fabrics", bounds.get("fabrics{}"), out)
    return out[:MAX_PROBLEMS_REPORTED]


def _phases(phases: Any, where: str, out: list[str]) -> None:
    """A shard's start phases: seconds within [0, MAX_PHASE_S] each, ``weights_local`` true or false.

    Refused rather than dropped: these become the cold-start estimate a
    waiting client is told, so a node that sends absurd timings hears why.
    """
    if phases is None:
        return
    if not isinstance(phases, dict):
        out.append(f"{where} must be an object of {', '.join(PHASE_SECONDS)} (seconds) and weights_local")
        return
    for name in PHASE_SECONDS:
        value = phases.get(name)
        if value is not None and not (_number(value) and 0 <= value <= MAX_PHASE_S):
            out.append(f"{where}.{name} must be a number of seconds between 0 and {MAX_PHASE_S:.0f}")
    if phases.get("weights_local") is not None and not _bool(phases["weights_local"]):
        out.append(f"{where}.weights_local must be true or false")


def heartbeat_problems(beat: Any) -> list[str]:
    if not isinstance(beat, dict):
        return ["the heartbeat must be a JSON object"]
    out: list[str] = []
    unstorable(beat, "heartbeat", out)
    if out:
        return out[:MAX_PROBLEMS_REPORTED]
    if "load" in beat and not _nullable(_dict)(beat["load"]):
        out.append("heartbeat.load must be an object")
    if "shards" in beat:
        shards = beat["shards"]
        if not isinstance(shards, list) or not all(isinstance(s, dict) for s in shards):
            out.append("heartbeat.shards must be a list of objects")
        elif len(shards) > 256:
            out.append("heartbeat.shards has more than 256 entries")
        else:
            for i, shard in enumerate(shards):
                _phases(shard.get("phases"), f"heartbeat.shards[{i}].phases", out)
    if "collected" in beat:
        done = beat["collected"]
        if not isinstance(done, list) or not all(isinstance(d, dict) and _str(d.get("path")) for d in done):
            out.append("heartbeat.collected must be a list of objects with the path that was deleted")
    if "prefetch" in beat:
        entries = beat["prefetch"]
        if not isinstance(entries, list) or not all(isinstance(e, dict) and _str(e.get("model")) for e in entries):
            out.append("heartbeat.prefetch must be a list of objects naming the model being fetched")
        elif len(entries) > 256:
            out.append("heartbeat.prefetch has more than 256 entries")
    if "report_digest" in beat and not _str(beat["report_digest"]):
        out.append("heartbeat.report_digest must be a string")
    return out[:MAX_PROBLEMS_REPORTED]
