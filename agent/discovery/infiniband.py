"""InfiniBand and RoCE ports: from sysfs live, or from ``ibstat``/``ibstatus`` text when replaying.

Each port is one dict. Forms chosen so every source reads the same:

- ``state``: the kernel's names, upper case: ``DOWN``, ``INIT``, ``ARMED``, ``ACTIVE``, ``ACTIVE_DEFER``
  (``ibstat``'s ``Active``/``Initializing`` are translated to these).
- ``phys_state``: ``LinkUp``, ``Polling``, ``Disabled``, ``Sleep``, ``LinkErrorRecovery``, ... as the kernel names it.
- ``rate_gbps``: float, the figure before ``Gb/sec`` (400.0 for ``400 Gb/sec (4X NDR)``).
- ``node_guid``, ``port_guid``, ``sm_guid``: ``0x`` + 16 lower-case hex digits, exactly as ``ibstat`` and
  ``sminfo`` print them (sysfs's ``58a2:e103:00a7:820e`` becomes ``0x58a2e10300a7820e``).
- ``lid``, ``sm_lid``: ints. Left out for Ethernet (RoCE) ports, where they mean nothing.
- ``counters``: the numeric files of ``ports/<n>/counters`` as the kernel gives them; note that
  ``port_rcv_data``/``port_xmit_data`` count 4-byte words, not bytes.
- ``sm_guid`` or ``sm_error`` (``link_layer`` InfiniBand only): the subnet manager's GUID, which names the physical
  fabric, or the sentence saying why it could not be read.
- ``netdev`` and ``network`` (RoCE, ``link_layer`` Ethernet, only): the port's netdev and its IPv4
  network (CIDR), which names the RoCE fabric; ``network_error`` says why it is missing.

Other RDMA devices in that class (AWS EFA reports ``link_layer`` ``Unspecified``) are listed with
neither. A key that is absent is unknown. No ``/sys/class/infiniband`` means no ports: ``[]``.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Callable
from pathlib import Path

from agent.discovery.errors import DiscoveryError
from agent.discovery.sources import Sources
from agent.discovery.tools import ToolOutput, run_tool

Run = Callable[[list[str]], ToolOutput]

# ibstat prints its own words for the logical state; the kernel's are the ones we keep.
_IBSTAT_STATES = {
    "down": "DOWN",
    "initializing": "INIT",
    "init": "INIT",
    "armed": "ARMED",
    "active": "ACTIVE",
    "active_defer": "ACTIVE_DEFER",
    "active defer": "ACTIVE_DEFER",
    "unknown": "NOP",
    "nop": "NOP",
}
_RATE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)")
_SMINFO_RE = re.compile(
    r"sm lid\s+(\d+)\s+sm guid\s+(0x[0-9a-fA-F]+)\s*,\s*activity count\s+(\d+)"
    r"\s+priority\s+(\d+)\s+state\s+(\d+)(?:\s+(\S+))?"
)
_CA_RE = re.compile(r"^CA\s+'([^']*)'\s*$")
_PORT_RE = re.compile(r"^Port\s+(\d+):\s*$")
_IBSTATUS_RE = re.compile(r"^Infiniband device\s+'([^']*)'\s+port\s+(\d+)\s+status:\s*$")
_NATURAL_RE = re.compile(r"(\d+)")


# --- small pure readers -------------------------------------------------------------------------------------------


def parse_state(text: str) -> str:
    """``4: ACTIVE`` (sysfs, ibstatus) and ``Active`` (ibstat) both → ``ACTIVE``."""
    value = text.split(":", 1)[1] if ":" in text else text
    value = value.strip()
    if not value:
        raise DiscoveryError(f"empty port state {text!r}")
    return _IBSTAT_STATES.get(value.lower(), value.upper())


def parse_phys_state(text: str) -> str:
    """``5: LinkUp`` → ``LinkUp``; ``ibstat`` already prints the bare name."""
    value = (text.split(":", 1)[1] if ":" in text else text).strip()
    if not value:
        raise DiscoveryError(f"empty physical state {text!r}")
    return value


def parse_rate(text: str) -> float:
    """``400 Gb/sec (4X NDR)`` or ibstat's bare ``400`` → 400.0."""
    match = _RATE_RE.match(text)
    if not match:
        raise DiscoveryError(f"rate not understood: {text!r}")
    return float(match.group(1))


def parse_int(text: str) -> int:
    """sysfs and ibstatus print LIDs in hex (``0x33bf``), ibstat in decimal (``13247``)."""
    value = text.strip()
    try:
        return int(value, 16) if value.lower().startswith("0x") else int(value)
    except ValueError as exc:
        raise DiscoveryError(f"not a number: {value!r}") from exc


def format_guid(text: str) -> str:
    """Any GUID spelling (``0x58A2...``, ``58a2:e103:00a7:820e``) → ``0x`` + 16 lower-case hex digits."""
    digits = text.strip().lower().removeprefix("0x").replace(":", "")
    if not digits or len(digits) > 16 or not re.fullmatch(r"[0-9a-f]+", digits):
        raise DiscoveryError(f"not a GUID: {text!r}")
    return "0x" + digits.rjust(16, "0")


def guid_from_gid(text: str) -> str | None:
    """The port GUID is the lower 64 bits of GID 0; None for an all-zero or ``unknown`` GID."""
    value = text.strip().lower()
    if value in ("", "unknown"):
        return None
    groups = value.split(":")
    if len(groups) != 8 or not all(re.fullmatch(r"[0-9a-f]{1,4}", g) for g in groups):
        raise DiscoveryError(f"not a GID: {text!r}")
    low = "".join(g.rjust(4, "0") for g in groups[4:])
    return None if int(low, 16) == 0 else "0x" + low


def parse_sminfo(text: str) -> dict:
    """``sminfo: sm lid 1 sm guid 0x248a..., activity count 5521 priority 15 state 3 SMINFO_MASTER``.

    No real capture of sminfo was available; this follows the line infiniband-diags prints.
    """
    match = _SMINFO_RE.search(text)
    if not match:
        raise DiscoveryError(f"sminfo output not understood: {text.strip()[:100]!r}")
    lid, guid, activity, priority, state, name = match.groups()
    info = {
        "sm_lid": int(lid),
        "sm_guid": format_guid(guid),
        "activity_count": int(activity),
        "priority": int(priority),
        "sm_state": int(state),
    }
    if name:
        info["sm_state_name"] = name
    return info


def parse_ip_networks(text: str) -> list[str]:
    """IPv4 networks (CIDR) from ``ip -j -4 addr show`` JSON, global addresses first."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise DiscoveryError(f"ip -j output is not JSON: {exc}") from exc
    found: list[tuple[bool, str]] = []
    for link in data if isinstance(data, list) else []:
        for addr in (link.get("addr_info") or []) if isinstance(link, dict) else []:
            if not isinstance(addr, dict) or addr.get("family", "inet") != "inet":
                continue
            try:
                net = ipaddress.ip_interface(f"{addr['local']}/{addr['prefixlen']}").network
            except (KeyError, ValueError, TypeError):
                continue
            found.append((addr.get("scope") != "global", str(net)))
    return [net for _, net in sorted(found, key=lambda f: f[0])]


def parse_ip_addresses(text: str) -> list[str]:
    """Every IPv4 address in ``ip -j -4 addr show`` JSON; used to find this node in the IMEX list."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise DiscoveryError(f"ip -j output is not JSON: {exc}") from exc
    return [
        str(addr["local"])
        for link in (data if isinstance(data, list) else [])
        if isinstance(link, dict)
        for addr in (link.get("addr_info") or [])
        if isinstance(addr, dict) and "local" in addr
    ]


def natural_key(name: str) -> list:
    """mlx5_2 before mlx5_10."""
    return [int(part) if part.isdigit() else part for part in _NATURAL_RE.split(name)]


# --- ibstat / ibstatus text (pure) --------------------------------------------------------------------------------


def parse_ib_text(text: str) -> tuple[list[dict], list[str]]:
    """Ports from ``ibstat`` or ``ibstatus`` output, whichever it is, and problem sentences.

    ibstat can print some adapters and then die (``ibpanic: ...``, exit 255): the ports printed
    are kept and the panic becomes a problem. DiscoveryError when nothing usable is there.
    """
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    if _CA_RE.match(first):
        ports, problems = _parse_ibstat(text)
    elif _IBSTATUS_RE.match(first):
        ports, problems = _parse_ibstatus(text)
    elif first.startswith("ibpanic:") or first.startswith("ibwarn:"):
        raise DiscoveryError(f"ibstat printed no adapters: {first[:160]}")
    else:
        raise DiscoveryError("neither ibstat nor ibstatus output: it starts with " + repr(first[:60]))
    if not ports:
        raise DiscoveryError("; ".join(problems) or "no ports in the ibstat output")
    return ports, problems


def _key_value(line: str) -> tuple[str, str]:
    if ":" not in line:
        raise DiscoveryError(f"line not understood: {line.strip()[:80]!r}")
    key, value = line.split(":", 1)
    return key.strip().lower(), value.strip()


def _parse_ibstat(text: str) -> tuple[list[dict], list[str]]:
    ports: list[dict] = []
    problems: list[str] = []
    ca: dict | None = None
    port: dict | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if line.startswith(("ibpanic:", "ibwarn:", "ibstat:")):
            where = f" after {len({p['hca'] for p in ports})} adapters" if ports else ""
            problems.append(f"ibstat stopped with an error{where}: {line[:200]}")
            ca = port = None
            continue
        ca_match = _CA_RE.match(line)
        if ca_match:
            ca, port = {"hca": ca_match.group(1)}, None
            continue
        if ca is None:
            raise DiscoveryError(f"ibstat line outside any CA block: {line[:80]!r}")
        port_match = _PORT_RE.match(line)
        if port_match:
            port = {"hca": ca["hca"], "port": int(port_match.group(1)), **_ca_facts(ca)}
            ports.append(port)
            continue
        key, value = _key_value(line)
        if port is None:
            ca[key] = value
        else:
            _set_ibstat_port_field(port, key, value)
    return [_finish(p) for p in ports], problems


def _ca_facts(ca: dict) -> dict:
    facts = {}
    if ca.get("node guid"):
        facts["node_guid"] = format_guid(ca["node guid"])
    if ca.get("ca type"):
        facts["ca_type"] = ca["ca type"]
    if ca.get("firmware version"):
        facts["firmware"] = ca["firmware version"]
    return facts


def _set_ibstat_port_field(port: dict, key: str, value: str) -> None:
    if key == "state":
        port["state"] = parse_state(value)
    elif key == "physical state":
        port["phys_state"] = parse_phys_state(value)
    elif key == "rate":
        port["rate_gbps"] = parse_rate(value)
    elif key == "base lid":
        port["lid"] = parse_int(value)
    elif key == "sm lid":
        port["sm_lid"] = parse_int(value)
    elif key == "port guid":
        port["port_guid"] = format_guid(value)
    elif key == "link layer":
        port["link_layer"] = value


def _parse_ibstatus(text: str) -> tuple[list[dict], list[str]]:
    ports: list[dict] = []
    port: dict | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        head = _IBSTATUS_RE.match(line)
        if head:
            port = {"hca": head.group(1), "port": int(head.group(2))}
            ports.append(port)
            continue
        if port is None:
            raise DiscoveryError(f"ibstatus line outside any device block: {line[:80]!r}")
        key, value = _key_value(line)
        _set_ibstatus_port_field(port, key, value)
    return [_finish(p) for p in ports], []


def _set_ibstatus_port_field(port: dict, key: str, value: str) -> None:
    if key == "default gid":
        guid = guid_from_gid(value)
        if guid:
            port["port_guid"] = guid
    elif key == "base lid":
        port["lid"] = parse_int(value)
    elif key == "sm lid":
        port["sm_lid"] = parse_int(value)
    elif key == "state":
        port["state"] = parse_state(value)
    elif key == "phys state":
        port["phys_state"] = parse_phys_state(value)
    elif key == "rate":
        port["rate_gbps"] = parse_rate(value)
    elif key in ("link_layer", "link layer"):
        port["link_layer"] = value


def _finish(port: dict) -> dict:
    """Drop what means nothing on Ethernet: RoCE ports have no LID and no subnet manager."""
    if _layer(port) == "ethernet":
        port.pop("lid", None)
        port.pop("sm_lid", None)
    return port


# --- sysfs (thin) -------------------------------------------------------------------------------------------------


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace").strip()
    except OSError:
        return None  # absent or refused (some VFs refuse counters): unknown, never zero


def read_counters(directory: Path) -> dict[str, int]:
    counters: dict[str, int] = {}
    try:
        files = sorted(directory.iterdir())
    except OSError:
        return counters
    for path in files:
        value = _read(path)
        if value is not None and re.fullmatch(r"\d+", value):
            counters[path.name] = int(value)
    return counters


def read_sysfs_port(hca_dir: Path, port_dir: Path) -> dict:
    """One port's facts from sysfs; fields that cannot be read are left out."""
    port: dict = {"hca": hca_dir.name, "port": int(port_dir.name)}
    readers: list[tuple[str, str, Callable[[str], object]]] = [
        ("state", "state", parse_state),
        ("phys_state", "phys_state", parse_phys_state),
        ("rate_gbps", "rate", parse_rate),
        ("link_layer", "link_layer", str.strip),
        ("lid", "lid", parse_int),
        ("sm_lid", "sm_lid", parse_int),
    ]
    for key, name, parse in readers:
        raw = _read(port_dir / name)
        if raw:
            try:
                port[key] = parse(raw)
            except DiscoveryError:
                continue
    for key, path, parse in (
        ("node_guid", hca_dir / "node_guid", format_guid),
        ("port_guid", port_dir / "gids" / "0", guid_from_gid),
        ("ca_type", hca_dir / "hca_type", str.strip),
        ("firmware", hca_dir / "fw_ver", str.strip),
    ):
        raw = _read(path)
        try:
            value = parse(raw) if raw else None
        except DiscoveryError:
            value = None
        if value:
            port[key] = value
    counters = read_counters(port_dir / "counters")
    if counters:
        port["counters"] = counters
    return _finish(port)


def read_sysfs_ports(sysfs_root: Path) -> list[dict]:
    """Every port under ``class/infiniband``; [] when the directory is absent (no RDMA adapters)."""
    base = sysfs_root / "class" / "infiniband"
    if not base.is_dir():
        return []
    ports = []
    for hca_dir in sorted(base.iterdir(), key=lambda p: natural_key(p.name)):
        ports_dir = hca_dir / "ports"
        if not ports_dir.is_dir():
            continue
        for port_dir in sorted(ports_dir.iterdir(), key=lambda p: natural_key(p.name)):
            if port_dir.name.isdigit():
                ports.append(read_sysfs_port(hca_dir, port_dir))
    return ports


def port_netdev(sysfs_root: Path, hca: str, port: int) -> str | None:
    """The netdev behind a RoCE port: the GID table's, else the only one on the adapter's PCI function."""
    base = sysfs_root / "class" / "infiniband" / hca
    name = _read(base / "ports" / str(port) / "gid_attrs" / "ndevs" / "0")
    if name:
        return name
    try:
        names = sorted(p.name for p in (base / "device" / "net").iterdir())
    except OSError:
        return None
    return names[0] if len(names) == 1 else None


# --- SM and network (live tools) ----------------------------------------------------------------------------------


def sm_of(port: dict, run: Run, missing_tool: list[str]) -> dict:
    """``{"sm_guid": ...}`` or ``{"sm_error": why}`` for an InfiniBand port."""
    state = port.get("state")
    if state == "INIT":
        # The link trained but nobody assigned it a LID: the classic sign of a fabric without a running SM.
        return {"sm_error": "port is INIT: the link is up but no subnet manager has made it ACTIVE"}
    if state != "ACTIVE":
        return {"sm_error": f"port is {state or 'in an unknown state'}, so no subnet manager answers"}
    if port.get("sm_lid") == 0:
        return {"sm_error": "no subnet manager has configured this port (SM lid 0)"}
    if missing_tool:
        return {"sm_error": missing_tool[0]}  # one missing sminfo is missing for every port
    out = run(["sminfo", "-C", port["hca"], "-P", str(port["port"])])
    if out.error is not None:
        if out.error.endswith("not found"):
            missing_tool.append(out.error)
        return {"sm_error": out.error}
    try:
        return {"sm_guid": parse_sminfo(out.stdout or "")["sm_guid"]}
    except DiscoveryError as exc:
        return {"sm_error": str(exc)}


def network_of(netdev: str | None, run: Run) -> dict:
    """``{"netdev", "network"}`` or ``{"network_error"}`` for a RoCE port."""
    if not netdev:
        return {"network_error": "no netdev is tied to this port"}
    out = run(["ip", "-j", "-4", "addr", "show", "dev", netdev])
    if out.error is not None:
        return {"netdev": netdev, "network_error": out.error}
    try:
        networks = parse_ip_networks(out.stdout or "")
    except DiscoveryError as exc:
        return {"netdev": netdev, "network_error": str(exc)}
    if not networks:
        return {"netdev": netdev, "network_error": f"{netdev} has no IPv4 address"}
    return {"netdev": netdev, "network": networks[0]}


def collect_ib_ports(sources: Sources, run: Run = run_tool) -> tuple[list[dict], list[str]]:
    """The ``ib_ports`` section and its problem sentences.

    With ``--ibstat FILE`` the capture replaces sysfs and no live tool is asked (the SM and the
    network of a replayed machine are not ours to query). DiscoveryError when a capture cannot
    be read or holds nothing usable.
    """
    if sources.ibstat is not None:
        try:
            text = sources.ibstat.read_text(errors="replace")
        except OSError as exc:
            raise DiscoveryError(f"cannot read ibstat capture {sources.ibstat}: {exc.strerror}") from exc
        ports, problems = parse_ib_text(text)
        for port in ports:
            if _layer(port) == "infiniband":
                port["sm_error"] = "not read: the ports come from a capture"
        return ports, problems
    ports = read_sysfs_ports(sources.sysfs_root)
    missing_tool: list[str] = []
    for port in ports:
        if _layer(port) == "ethernet":
            port.update(network_of(port_netdev(sources.sysfs_root, port["hca"], port["port"]), run))
        elif _layer(port) == "infiniband":
            port.update(sm_of(port, run, missing_tool))
        # Other RDMA devices (AWS EFA says "Unspecified", iWARP) have neither a subnet manager nor a RoCE
        # network: asking sminfo about them would only fail, once per device.
    return ports, []


def _layer(port: dict) -> str:
    return str(port.get("link_layer", "")).lower()
