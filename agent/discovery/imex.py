"""IMEX: is ``nvidia-imex`` running, is its domain up, and which channels exist.

IMEX (Internode Memory Exchange) is what lets GPUs in different nodes of one
multi-node NVLink domain (GB200 NVL72, GH200 NVL32) import each other's memory.
A domain is usable by a multi-node replica only when the daemon runs on every
node, the domain reports UP, this node is READY, and an IMEX channel exists
(``/dev/nvidia-caps-imex-channels/channelN``): without a channel CUDA's fabric
memory calls fail with an insufficient-permission error.

``state`` vocabulary (the one field the control plane branches on):

- ``"up"``: the daemon answered, ``Domain State: UP``, and this node is READY
  (when this node cannot be picked out of the node list, every node must be
  READY instead).
- ``"down"``: the daemon answered, but the domain is not UP or this node is not
  READY; ``problems`` says which.
- ``"unknown"``: the daemon runs, but its status could not be read
  (``nvidia-imex-ctl`` missing, failing, or printing text we cannot read).
- ``"not running"``: IMEX is installed (``nvidia-imex-ctl`` or
  ``/etc/nvidia-imex/config.cfg`` exists) but no daemon runs. A problem.
- ``"not installed"``: neither the tool, the config nor the daemon is there.
  Normal on any node outside a multi-node NVLink domain, so NOT a problem.

An absent ``node_status`` means this node could not be found in the node list;
an absent ``domain_state``/``nodes`` means no status was read.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path

from agent.discovery.errors import DiscoveryError
from agent.discovery.sources import Sources
from agent.discovery.tools import ToolOutput, run_tool

DAEMON_COMM = "nvidia-imex"
CHANNELS_DIR = "nvidia-caps-imex-channels"
CTL = "nvidia-imex-ctl"
NODE_READY = "READY"
DOMAIN_UP = "UP"
# More matrix sentences than this would bury the rest of the report; the count says how many were left out.
MAX_LINK_PROBLEMS = 8

_NODE_RE = re.compile(r"^Node\s*#\s*(\d+)\s+-\s+(.*)$")
_LEGEND_RE = re.compile(r"^(\S{1,5})\s+-\s+(.+)$")
_DOMAIN_RE = re.compile(r"^Domain State:\s*(.*)$")
_MATRIX_HEADER_RE = re.compile(r"^Nodes\s+From\s*\\\s*To\b(.*)$")
_TIMESTAMP_RE = re.compile(r"^\d{1,2}/\d{1,2}/\d{4}\s+\d{1,2}:\d{2}:\d{2}(\.\d+)?$")
_VERSION_RE = re.compile(r"^Version:\s*(\S+)$")
_CHANNEL_RE = re.compile(r"^channel(\d+)$")


# --- parsing (pure) -----------------------------------------------------------------------------------------------


def parse_imex_status(text: str) -> dict:
    """Read ``nvidia-imex-ctl -N`` text: both the 570.00 layout and the later one with a Version column.

    Returns ``{"legend": {code: meaning}, "nodes": [...], "matrix": {from: {to: code}}, "domain_state": str}``;
    ``matrix`` is absent when the output has no connectivity table. Each node is
    ``{"index", "address", "status"}`` plus ``"version"``/``"hostname"`` when printed.
    Raises DiscoveryError for text that is not such a status (no node list, no Domain State,
    a node line or matrix row that does not read).
    """
    lines = [line.rstrip() for line in text.splitlines()]
    legend: dict[str, str] = {}
    nodes: list[dict] = []
    matrix: dict[int, dict[int, str]] | None = None
    domain_state: str | None = None
    i = 0
    while i < len(lines):
        stripped = lines[i].strip()
        if stripped == "Connectivity Table Legend:":
            i = _read_legend(lines, i + 1, legend)
            continue
        if stripped == "Nodes:":
            i = _read_nodes(lines, i + 1, nodes)
            continue
        header = _MATRIX_HEADER_RE.match(stripped)
        if header:
            matrix = {}
            i = _read_matrix(lines, i + 1, header.group(1), matrix)
            continue
        domain = _DOMAIN_RE.match(stripped)
        if domain:
            if not domain.group(1).strip():
                raise DiscoveryError("IMEX status has an empty Domain State")
            domain_state = domain.group(1).strip()
        # Anything else (the timestamp line, a banner a newer release adds) carries nothing we use.
        i += 1
    return _checked_status(legend, nodes, matrix, domain_state)


def _read_legend(lines: list[str], i: int, legend: dict[str, str]) -> int:
    while i < len(lines) and lines[i].strip():
        match = _LEGEND_RE.match(lines[i].strip())
        if not match:
            break
        code, rest = match.groups()
        # "I - Invalid - Node wasn't reachable ..." names the code before the second dash.
        legend[code] = rest.split(" - ")[0].strip()
        i += 1
    return i


def _read_nodes(lines: list[str], i: int, nodes: list[dict]) -> int:
    while i < len(lines) and lines[i].strip().startswith("Node"):
        stripped = lines[i].strip()
        if _MATRIX_HEADER_RE.match(stripped):
            break
        nodes.append(_parse_node_line(stripped))
        i += 1
    return i


def _parse_node_line(line: str) -> dict:
    match = _NODE_RE.match(line)
    if not match:
        raise DiscoveryError(f"IMEX node line not understood: {line[:80]!r}")
    parts = [p.strip() for p in re.split(r"\s+-\s+", match.group(2))]
    if len(parts) < 2 or not parts[0] or not parts[1]:
        raise DiscoveryError(f"IMEX node line lacks an address or a status: {line[:80]!r}")
    address, *host = parts[0].split(None, 1)
    node: dict = {"index": int(match.group(1)), "address": address, "status": parts[1]}
    if host:
        # -H prints the host name beside the address; keep it without the brackets some layouts add.
        node["hostname"] = host[0].strip("()[] ")
    for extra in parts[2:]:
        version = _VERSION_RE.match(extra)
        if version:
            node["version"] = version.group(1)
    return node


def _read_matrix(lines: list[str], i: int, header: str, matrix: dict[int, dict[int, str]]) -> int:
    columns = header.split()
    if not columns or not all(c.isdigit() for c in columns):
        raise DiscoveryError("IMEX connectivity table header does not list node numbers")
    targets = [int(c) for c in columns]
    while i < len(lines):
        cells = lines[i].split()
        if not cells or not cells[0].isdigit():
            break
        if len(cells) - 1 != len(targets):
            raise DiscoveryError(
                f"IMEX connectivity row {cells[0]} has {len(cells) - 1} entries for {len(targets)} nodes (truncated?)"
            )
        matrix[int(cells[0])] = dict(zip(targets, cells[1:], strict=True))
        i += 1
    return i


def _checked_status(
    legend: dict[str, str], nodes: list[dict], matrix: dict[int, dict[int, str]] | None, domain_state: str | None
) -> dict:
    if not nodes:
        raise DiscoveryError("IMEX status lists no nodes")
    if domain_state is None:
        raise DiscoveryError("IMEX status has no Domain State line (truncated?)")
    indexes = [n["index"] for n in nodes]
    if len(set(indexes)) != len(indexes):
        raise DiscoveryError("IMEX status lists a node number twice")
    status: dict = {"legend": legend, "nodes": nodes, "domain_state": domain_state}
    if matrix is not None:
        if set(matrix) != set(indexes):
            raise DiscoveryError(
                f"IMEX connectivity table has rows for {len(matrix)} nodes but the node list has {len(nodes)}"
            )
        status["matrix"] = matrix
    return status


def parse_channels(names: Iterable[str]) -> list[int]:
    """Channel numbers from the entries of ``/dev/nvidia-caps-imex-channels`` (``channel0`` → 0), sorted."""
    return sorted({int(m.group(1)) for m in (_CHANNEL_RE.match(n) for n in names) if m})


# --- judging (pure) -----------------------------------------------------------------------------------------------


def find_this_node(nodes: list[dict], local_addresses: Iterable[str]) -> dict | None:
    """The node entry that is this machine: the only one, or the one carrying one of our addresses."""
    if len(nodes) == 1:
        return nodes[0]
    local = set(local_addresses)
    mine = [n for n in nodes if n["address"] in local]
    return mine[0] if len(mine) == 1 else None


def judge_status(status: dict, local_addresses: Iterable[str] = ()) -> dict:
    """Turn a parsed status into the report's ``state``, ``node_status`` and problem sentences."""
    nodes = status["nodes"]
    this = find_this_node(nodes, local_addresses)
    domain = status["domain_state"]
    domain_up = domain.upper() == DOMAIN_UP
    problems = [] if domain_up else [f"IMEX domain state is {domain}, not UP"]
    result: dict = {"domain_state": domain, "nodes": [_public_node(n) for n in nodes]}
    if this is not None:
        result["node_status"] = this["status"]
        ready = this["status"].upper() == NODE_READY
        if not ready:
            problems.append(f"this node ({this['address']}) has IMEX status {this['status']}, not READY")
    else:
        # Without knowing which node we are, only a fully READY domain proves this node is ready.
        not_ready = [n for n in nodes if n["status"].upper() != NODE_READY]
        ready = not not_ready
        if not ready:
            problems.append("could not tell which IMEX node is this machine, and not every node is READY")
            problems += [f"IMEX node #{n['index']} ({n['address']}) is {n['status']}" for n in not_ready]
    problems += _link_problems(status, this)
    problems += _version_problems(nodes)
    result["state"] = "up" if domain_up and ready else "down"
    result["problems"] = problems
    return result


def _public_node(node: dict) -> dict:
    return {k: node[k] for k in ("index", "address", "hostname", "status", "version") if k in node}


def _link_problems(status: dict, this: dict | None) -> list[str]:
    """One sentence per connection that is not C (Connected), from this node's row when we know it."""
    matrix = status.get("matrix") or {}
    legend = status["legend"]
    by_index = {n["index"]: n for n in status["nodes"]}
    rows = [this["index"]] if this is not None else sorted(matrix)
    sentences = []
    for src in rows:
        for dst, code in sorted(matrix.get(src, {}).items()):
            if code != "C":
                meaning = legend.get(code, "unknown code")
                sentences.append(
                    f"IMEX link node #{src} ({by_index[src]['address']}) to node #{dst} "
                    f"({by_index.get(dst, {}).get('address', '?')}) is {code} ({meaning})"
                )
    if len(sentences) > MAX_LINK_PROBLEMS:
        left = len(sentences) - MAX_LINK_PROBLEMS
        sentences = [*sentences[:MAX_LINK_PROBLEMS], f"and {left} more IMEX links not connected"]
    return sentences


def _version_problems(nodes: list[dict]) -> list[str]:
    versions = Counter(n["version"] for n in nodes if "version" in n)
    if len(versions) <= 1:
        return []
    spread = ", ".join(f"{v} on {count} node{'s' if count > 1 else ''}" for v, count in versions.most_common())
    return [f"IMEX versions differ across the domain: {spread}"]


# --- reading (thin) -----------------------------------------------------------------------------------------------


def daemon_running(proc_root: Path) -> bool:
    """True when some process's ``comm`` is exactly ``nvidia-imex`` (``nvidia-imex-ctl`` is not the daemon)."""
    try:
        entries = list(proc_root.iterdir())
    except OSError as exc:
        raise DiscoveryError(f"cannot list processes in {proc_root}: {exc.strerror}") from exc
    for entry in entries:
        if not entry.name.isdigit():
            continue
        try:
            if (entry / "comm").read_text(errors="replace").strip() == DAEMON_COMM:
                return True
        except OSError:
            continue  # the process ended while we looked, or is not ours to read
    return False


def read_channels(dev_root: Path) -> list[int]:
    """Channel numbers present; [] when the directory does not exist (no channel was created)."""
    directory = dev_root / CHANNELS_DIR
    if not directory.is_dir():
        return []
    try:
        return parse_channels(p.name for p in directory.iterdir())
    except OSError as exc:
        raise DiscoveryError(f"cannot list {directory}: {exc.strerror}") from exc


def collect_imex(
    sources: Sources,
    run: Callable[[list[str]], ToolOutput] = run_tool,
    local_addresses: Callable[[], Iterable[str]] = tuple,
) -> dict:
    """The ``imex`` section. ``local_addresses`` is called only when the node list has several nodes.

    Raises DiscoveryError only when the process table cannot be read, or a capture named
    by ``--imex-status`` cannot be opened: then nothing about IMEX is known.
    """
    running = daemon_running(sources.proc_root)
    channels_problem = None
    try:
        channels: list[int] | None = read_channels(sources.dev_root)
    except DiscoveryError as exc:
        channels, channels_problem = None, str(exc)
    text, tool_error, tool_missing = _status_text(sources, run)
    config_exists = (sources.etc_root / "nvidia-imex" / "config.cfg").exists()
    result = _verdict(text, tool_error, tool_missing, running, config_exists, local_addresses)
    if channels is not None:
        result["channels"] = channels
    if channels_problem:
        result["problems"].append(channels_problem)
    elif result["state"] == "up" and not channels:
        result["problems"].append(
            f"IMEX is up but /dev/{CHANNELS_DIR} has no channel, so CUDA cannot import memory across nodes"
        )
    return result


def _status_text(sources: Sources, run: Callable[[list[str]], ToolOutput]) -> tuple[str | None, str | None, bool]:
    """(text, error, tool missing) from the capture or from ``nvidia-imex-ctl -N``."""
    if sources.imex_status is not None:
        try:
            return sources.imex_status.read_text(errors="replace"), None, False
        except OSError as exc:
            raise DiscoveryError(f"cannot read IMEX status capture {sources.imex_status}: {exc.strerror}") from exc
    argv = [CTL, "-N"]
    config = sources.etc_root / "nvidia-imex" / "config.cfg"
    if sources.etc_root != Path("/etc") and config.exists():
        argv += ["-c", str(config)]  # the tool's default is /etc's file; follow a relocated root
    out = run(argv)
    missing = out.error is not None and out.error == f"{CTL} not found"
    if out.error is not None:
        return None, out.error, missing
    return out.stdout or "", None, False


def _verdict(
    text: str | None,
    tool_error: str | None,
    tool_missing: bool,
    running: bool,
    config_exists: bool,
    local_addresses: Callable[[], Iterable[str]],
) -> dict:
    if text is not None:
        try:
            status = parse_imex_status(text)
        except DiscoveryError as exc:
            state = "unknown" if running else "not running"
            return {"state": state, "running": running, "problems": [f"IMEX status not understood: {exc}"]}
        addresses = local_addresses() if len(status["nodes"]) > 1 else ()
        # The daemon serves nvidia-imex-ctl itself, so an answer proves it runs even where its process
        # is hidden from us (the agent in its own PID namespace).
        return {"running": True, **judge_status(status, addresses)}
    if running:
        why = f"{CTL} not found" if tool_missing else tool_error
        return {"state": "unknown", "running": True, "problems": [f"nvidia-imex runs but its status is unknown: {why}"]}
    if tool_missing and not config_exists:
        return {"state": "not installed", "running": False, "problems": []}
    return {"state": "not running", "running": False, "problems": ["IMEX is installed but nvidia-imex is not running"]}
