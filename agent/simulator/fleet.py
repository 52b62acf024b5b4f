"""The simulated machines: what each reports, and the faults that change it.

A fleet SPEC names how many of each kind: ``gb200-nvl72:2,h100-hgx:8,a100-mig:2,cpu:2``.
``gb200-nvl72:2`` is two racks of 18 trays × 4 GPUs, each rack one NVLink
domain (its own ClusterUUID and CliqueId). A kind followed by ``@NAME`` sits on
the InfiniBand fabric NAME, which has its own subnet manager:
``h100-hgx:4@north,h100-hgx:4@south`` is two fabrics.

GPU facts come from captures shipped in ``captures/`` (copies of the public
captures in shared/fixtures, see SOURCES.md there), parsed by the real
discovery code, then given per-node UUIDs so that no two simulated cards
collide.
"""

from __future__ import annotations

import copy
import hashlib
import re
import time
import uuid
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from agent.discovery.imex import parse_imex_status
from agent.discovery.infiniband import parse_ib_text
from agent.discovery.report import collect_gpus
from agent.discovery.sources import Sources

CAPTURES = Path(__file__).parent / "captures"
KINDS = ("gb200-nvl72", "h100-hgx", "a100-mig", "cpu")
TRAYS_PER_RACK = 18
SIM_NAMESPACE = uuid.UUID("6f1a3c52-0d8e-4c57-9a43-7d3cbb0e1f10")
SPEC_RE = re.compile(r"^(?P<kind>[a-z0-9-]+):(?P<count>\d+)(?:@(?P<fabric>[A-Za-z0-9_.-]+))?$")


class SpecError(ValueError):
    """A fleet SPEC that cannot be read, with what to write instead."""


@dataclass(frozen=True)
class Group:
    kind: str
    count: int
    fabric: str | None


def parse_spec(spec: str) -> list[Group]:
    groups = []
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        match = SPEC_RE.match(part)
        if not match:
            raise SpecError(f"{part!r} is not KIND:COUNT or KIND:COUNT@FABRIC (kinds: {', '.join(KINDS)})")
        if match["kind"] not in KINDS:
            raise SpecError(f"unknown kind {match['kind']!r}; use one of {', '.join(KINDS)}")
        groups.append(Group(match["kind"], int(match["count"]), match["fabric"]))
    if not groups:
        raise SpecError("the fleet is empty; e.g. gb200-nvl72:1,h100-hgx:4,cpu:2")
    return groups


def _uuid(*parts: object) -> str:
    return str(uuid.uuid5(SIM_NAMESPACE, "/".join(map(str, parts))))


def _guid(*parts: object) -> str:
    return "0x" + hashlib.sha256("/".join(map(str, parts)).encode()).hexdigest()[:16]


@cache
def _template_gpus(kind: str) -> tuple[dict, ...]:
    files = {
        "gb200-nvl72": Sources(nvidia_smi_xml=CAPTURES / "gb200-tray.xml", use_nvml=False),
        "h100-hgx": Sources(nvidia_smi_xml=CAPTURES / "h100-hgx.xml", topo=CAPTURES / "h100-topo.txt", use_nvml=False),
        "a100-mig": Sources(nvidia_smi_xml=CAPTURES / "a100-mig.xml", use_nvml=False),
    }
    if kind not in files:
        return ()
    return tuple(collect_gpus(files[kind]).gpus)


@cache
def _template_ports() -> tuple[dict, ...]:
    ports, _ = parse_ib_text((CAPTURES / "h100-ibstat.txt").read_text())
    return tuple(p for p in ports if p.get("link_layer") == "InfiniBand")


@cache
def _template_imex() -> dict:
    return parse_imex_status((CAPTURES / "gb200-imex.txt").read_text())


@dataclass
class SimNode:
    """One simulated machine and the state its faults have put it in."""

    name: str
    kind: str
    rack: str | None = None
    fabric: str | None = None
    alive: bool = True
    gpus: list[dict] = field(default_factory=list)
    ib_ports: list[dict] = field(default_factory=list)
    imex: dict | None = None
    memory_mb: int = 65536
    engines: dict = field(default_factory=dict)
    version: int = 0  # bumped by each fault, so the loop knows to send a full report

    def report(self) -> dict:
        report = {
            "schema": 1,
            "agent_version": "sim",
            "hostname": f"{self.name}.sim",
            # Every simulated engine listens on this machine (simulator/engine.py).
            "address": "127.0.0.1",
            "gpu_source": "capture" if self.gpus else "none",
            "gpus": copy.deepcopy(self.gpus),
            "ib_ports": copy.deepcopy(self.ib_ports),
            "host": {
                "hostname": f"{self.name}.sim",
                "os": "ubuntu",
                "os_version": "24.04",
                "arch": "aarch64" if self.kind == "gb200-nvl72" else "x86_64",
                "cpu_flags": [] if self.kind == "gb200-nvl72" else ["sse4_2", "avx", "avx2", "avx512f"],
                "memory_mb": self.memory_mb,
                "cpus": 144 if self.kind == "gb200-nvl72" else 64,
            },
            "disks": [
                {
                    "mount": "/models",
                    "device": "/dev/nvme0n1",
                    "fstype": "xfs",
                    "shared": False,
                    "total_bytes": 7_680_000_000_000,
                    "free_bytes": 5_000_000_000_000,
                }
            ],
            "engines": dict(self.engines),
            "problems": [],
        }
        if self.imex is not None:
            report["imex"] = copy.deepcopy(self.imex)
        if self.fabric:
            report["fabrics"] = {self.fabric: sorted({p["hca"] for p in self.ib_ports})}
        return report


def _gpus_for(kind: str, name: str, rack: str | None, rack_index: int) -> list[dict]:
    gpus = copy.deepcopy(list(_template_gpus(kind)))
    for gpu in gpus:
        if "parent" in gpu:
            # The A100 capture is `nvidia-smi -q -x`, which names no MIG UUIDs; a real agent would
            # read them from NVML or `nvidia-smi -L`, so each simulated instance gets one of its own.
            gpu["uuid"] = gpu["mig_uuid"] = "MIG-" + _uuid(name, gpu["index"])
            gpu["parent_uuid"] = "GPU-" + _uuid(name, gpu["parent"])
        else:
            gpu["uuid"] = "GPU-" + _uuid(name, gpu["index"])

        fabric = gpu.get("fabric")
        if fabric and rack is not None:
            fabric["cluster_uuid"] = _uuid("cluster", rack)
            fabric["clique_id"] = 32766 - rack_index
    return gpus


CA_RE = re.compile(r'^Ca\s+\d+\s+"H-([0-9a-fA-F]+)"\s+#\s+"([^"]*)"')


@cache
def _captured_adapters() -> tuple[str, ...]:
    """Host adapter GUIDs of the captured fabric map, so simulated nodes appear on it.

    Handed out in order, as many per simulated node as it has ports; nodes past
    the end of the list get adapters of their own that the map does not show.
    """
    guids = []
    for line in scan_capture().splitlines():
        match = CA_RE.match(line)
        if match and "Aggregation" not in match[2]:
            guids.append("0x" + match[1].lower().rjust(16, "0"))
    return tuple(guids)


@cache
def scan_capture() -> str:
    """The captured ``ibnetdiscover`` map each simulated fabric uploads as its scan."""
    return (CAPTURES / "superpod-ibnetdiscover.txt").read_text()


def _ports_for(name: str, fabric: str | None, count: int, first: int | None = None) -> list[dict]:
    adapters = _captured_adapters()
    guids = adapters[first : first + count] if first is not None else ()
    ports = []
    for i, template in enumerate(_template_ports()[:count]):
        port = copy.deepcopy(template)
        port["node_guid"] = port["port_guid"] = guids[i] if i < len(guids) else _guid(name, i)

        port["sm_guid"] = _guid("sm", fabric or "default")
        port["sm_lid"] = 1
        port["counters"] = {"symbol_error": 0, "link_downed": 0, "port_rcv_errors": 0}
        if fabric:
            port["fabric"] = fabric
        ports.append(port)
    return ports


def _imex_for(rack_nodes: list[str], this: int) -> dict:
    template = _template_imex()
    nodes = [{"index": i, "address": f"10.{this // 256}.{i}.1", "status": "READY"} for i in range(len(rack_nodes))]
    return {
        "state": "up",
        "running": True,
        "domain_state": template.get("domain_state", "UP"),
        "node_status": "READY",
        "channels": [0],
        "nodes": nodes,
    }


def build_fleet(spec: str, prefix: str = "") -> list[SimNode]:
    """Every node of a SPEC, in a stable order with stable names."""
    nodes: list[SimNode] = []
    counters = {kind: 0 for kind in KINDS}
    on_fabric: dict[str | None, int] = {}

    def adapters(fabric: str | None, count: int) -> int:
        """Where in the captured map's adapters this node's ports start, fabric by fabric."""
        first = on_fabric.get(fabric, 0)
        on_fabric[fabric] = first + count
        return first

    for group in parse_spec(spec):
        for _ in range(group.count):
            n = counters[group.kind]
            counters[group.kind] += 1
            if group.kind == "gb200-nvl72":
                rack = f"{prefix}nvl72-{n:02d}"
                names = [f"{rack}-tray-{t:02d}" for t in range(TRAYS_PER_RACK)]
                for t, name in enumerate(names):
                    nodes.append(
                        SimNode(
                            name=name,
                            kind=group.kind,
                            rack=rack,
                            fabric=group.fabric,
                            gpus=_gpus_for(group.kind, name, rack, n),
                            ib_ports=_ports_for(name, group.fabric, 4, adapters(group.fabric, 4)),
                            imex=_imex_for(names, t),
                            memory_mb=884_000,
                            engines={"vllm": "0.11.0", "sglang": "0.5.3"},
                        )
                    )
            elif group.kind == "h100-hgx":
                name = f"{prefix}hgx-{n:03d}"
                nodes.append(
                    SimNode(
                        name=name,
                        kind=group.kind,
                        fabric=group.fabric,
                        gpus=_gpus_for(group.kind, name, None, n),
                        ib_ports=_ports_for(name, group.fabric, 8, adapters(group.fabric, 8)),
                        memory_mb=2_064_000,
                        engines={"vllm": "0.11.0", "sglang": "0.5.3"},
                    )
                )
            elif group.kind == "a100-mig":
                name = f"{prefix}mig-{n:02d}"
                nodes.append(
                    SimNode(
                        name=name,
                        kind=group.kind,
                        fabric=group.fabric,
                        gpus=_gpus_for(group.kind, name, None, n),
                        memory_mb=1_031_000,
                        engines={"vllm": "0.11.0"},
                    )
                )
            else:
                name = f"{prefix}cpu-{n:02d}"
                nodes.append(
                    SimNode(
                        name=name,
                        kind=group.kind,
                        fabric=group.fabric,
                        memory_mb=65_536,
                        engines={"llamacpp": "0.3.16"},
                    )
                )
    return nodes


# --- faults -----------------------------------------------------------------------------------------------

LEFT = {"state": "In Progress", "status": "N/A", "health_summary": "Unhealthy"}


class FaultError(ValueError):
    """A fault that names nothing in this fleet."""


def _leave(gpu: dict) -> None:
    fabric = gpu.get("fabric")
    if fabric is not None:
        fabric.setdefault("_joined", {k: fabric.get(k) for k in LEFT})
        fabric.update(LEFT)


def _rejoin(gpu: dict) -> None:
    fabric = gpu.get("fabric")
    if fabric and "_joined" in fabric:
        fabric.update(fabric.pop("_joined"))


def tray_leave(node: SimNode) -> None:
    """Every card of the tray drops out of its NVLink domain."""
    for gpu in node.gpus:
        _leave(gpu)
    node.version += 1


def tray_rejoin(node: SimNode) -> None:
    for gpu in node.gpus:
        _rejoin(gpu)
    node.version += 1


def imex_down(node: SimNode) -> None:
    if node.imex is not None:
        node.imex.update(state="down", node_status="UNAVAILABLE")
        node.imex["problems"] = ["this node is UNAVAILABLE in the IMEX domain"]
        node.version += 1


def imex_up(node: SimNode) -> None:
    if node.imex is not None:
        node.imex.update(state="up", node_status="READY")
        node.imex.pop("problems", None)
        node.version += 1


def degrade(node: SimNode, gpu_index: int) -> None:
    """One card's NVLink bandwidth degrades: still joined, but amber."""
    gpu = _gpu(node, gpu_index)
    if gpu.get("fabric"):
        gpu["fabric"].update(bandwidth="Degraded", degraded=True, health_summary="Degraded BW")
    node.version += 1


def gpu_lost(node: SimNode, gpu_index: int) -> None:
    gpu = _gpu(node, gpu_index)
    gpu["health"] = ["lost by the driver (GPU is lost); reboot the node"]
    node.version += 1


# What the driver says with each Xid the simulator is asked for most (NVIDIA's Xid catalogue).
XID_WORDS = {
    13: "Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0): Out Of Range Address",
    31: "Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x0_00000000.",
    48: "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 0.",
    63: "Row Remapper: New row marked for remapping, reset gpu to activate.",
    74: "NVLink: fatal error detected on link 0(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)",
    79: "GPU has fallen off the bus.",
    92: "High single-bit ECC error rate detected",
    94: "Contained: SM (0x1). RST: No, D-RST: No",
    119: "Timeout after 6s of waiting for RPC response from GPU0 GSP!",
}
MAX_XIDS = 32  # what a report carries per card (inventory.report_schema.MAX_XIDS)


def xid(node: SimNode, gpu_index: int, code: int, at: float | None = None) -> None:
    """One Xid on one card: in its recent Xids (as the agent reads them) and in its health words."""
    gpu = _gpu(node, gpu_index)
    message = XID_WORDS.get(code, "simulated")
    events = [*gpu.get("xids", []), {"code": code, "at": time.time() if at is None else at, "message": message}]
    gpu["xids"] = events[-MAX_XIDS:]
    count = sum(1 for e in events if e["code"] == code)
    times = f" ({count} times)" if count > 1 else ""
    words = [w for w in gpu.get("health", []) if not w.startswith(f"Xid {code} ")]
    gpu["health"] = [*words, f"Xid {code}{times} in the kernel log, last: {message}"]
    node.version += 1


def ecc(node: SimNode, gpu_index: int) -> None:
    """One uncorrectable DRAM ECC error on one card: volatile (since the reset) and aggregate counters rise."""
    gpu = _gpu(node, gpu_index)
    counters = ("sram_correctable", "sram_uncorrectable", "dram_correctable", "dram_uncorrectable")
    ecc_facts = gpu.setdefault("ecc", {})
    for section in ("volatile", "aggregate"):
        block = ecc_facts.setdefault(section, {})
        for name in counters:
            block.setdefault(name, 0)
        block["dram_uncorrectable"] += 1
    node.version += 1


def mislabel(node: SimNode, fabric: str) -> None:
    """The node's configuration names the wrong fabric: what an operator's typo looks like."""
    node.fabric = fabric
    for port in node.ib_ports:
        port["fabric"] = fabric
    node.version += 1


def _gpu(node: SimNode, index: int) -> dict:

    for gpu in node.gpus:
        if gpu["index"] == index:
            return gpu
    raise FaultError(f"{node.name} has no gpu {index}")
