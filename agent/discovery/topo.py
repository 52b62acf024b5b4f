"""Parser for ``nvidia-smi topo -m``: NVLink peers, NIC nearness and CPU/NUMA affinity per GPU.

The matrix has one column per GPU and NIC, then affinity columns ("CPU
Affinity", "NUMA Affinity", "GPU NUMA ID"). nvidia-smi separates cells with
tabs, but copies often have them expanded to spaces, so the header is split on
tabs or runs of two or more spaces (the affinity headers contain single spaces)
and the rows on any whitespace (no cell contains a space).

Drivers since ~470 label NICs ``NIC0`` … and map them to device names in a
"NIC Legend" (``NIC0: mlx5_0``); older ones put the device name (``mlx5_0``)
straight into the header. Both are handled.

nvidia-smi underlines the header with terminal escapes (``ESC[4m`` …
``ESC[0m``) even when its output is a pipe or a file, as the H200 capture in
tests/agent/captures shows; escapes are taken out before anything is read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from agent.discovery.errors import DiscoveryError

# Link kinds, nearest first; SOC is the pre-2017 name of SYS.
NEARNESS = ("PIX", "PXB", "PHB", "NODE", "SYS")
_ALIASES = {"SOC": "SYS"}
_NV = re.compile(r"^NV(\d+)$")
_GPU = re.compile(r"^GPU(\d+)$")
_NIC = re.compile(r"^NIC(\d+)$")
_LEGEND_NIC = re.compile(r"^\s*(NIC\d+)\s*:\s*(\S+)\s*$")
# ECMA-48 control sequences (CSI: ESC [ parameters intermediates final), and any ESC left over.
_ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b")


@dataclass
class TopoGpu:
    """What the matrix says about one GPU (by nvidia-smi index)."""

    index: int
    nvlinks: dict[int, int] = field(default_factory=dict)  # peer GPU index -> bonded NVLink count
    nics: dict[str, str] = field(default_factory=dict)  # NIC device name -> PIX/PXB/PHB/NODE/SYS
    cpu_affinity: str | None = None
    numa: int | None = None


@dataclass
class Topology:
    gpus: dict[int, TopoGpu] = field(default_factory=dict)
    nic_names: dict[str, str] = field(default_factory=dict)  # NIC0 -> mlx5_0


def _split_header(line: str) -> list[str]:
    parts = line.split("\t") if "\t" in line else re.split(r"\s{2,}", line)
    return [p.strip() for p in parts if p.strip()]


def _legend(lines: list[str]) -> dict[str, str]:
    names: dict[str, str] = {}
    for line in lines:
        m = _LEGEND_NIC.match(line)
        if m:
            names[m.group(1)] = m.group(2)
    return names


def _numa(raw: str | None) -> int | None:
    """A single NUMA node number; "N/A", ranges or lists mean we cannot name one."""
    if raw is None or not re.fullmatch(r"\d+", raw):
        return None
    return int(raw)


def _is_link(token: str) -> bool:
    return token == "X" or bool(_NV.match(token)) or token.upper() in NEARNESS or token.upper() in _ALIASES


def _is_header(tokens: list[str]) -> bool:
    """The header starts with GPU0; a GPU row starts with GPUn followed by a link value ("X", "NV18", "PIX")."""
    return bool(tokens) and bool(_GPU.match(tokens[0])) and (len(tokens) == 1 or not _is_link(tokens[1]))


def parse_topo(text: str) -> Topology:
    """Parse ``nvidia-smi topo -m``. DiscoveryError when there is no GPU matrix to read."""
    if not text or not text.strip():
        raise DiscoveryError("nvidia-smi topo -m output is empty")
    lines = _ESCAPES.sub("", text).splitlines()
    header_at = next((i for i, line in enumerate(lines) if _is_header(line.split())), None)
    if header_at is None:
        raise DiscoveryError("nvidia-smi topo -m output has no header row naming the GPUs (GPU0 …)")
    columns = _split_header(lines[header_at])
    topo = Topology(nic_names=_legend(lines[header_at + 1 :]))
    for number_, line in enumerate(lines[header_at + 1 :], start=header_at + 2):
        cells = line.split()
        if not cells:
            continue
        if cells[0].lower().startswith("legend"):
            break
        m = _GPU.match(cells[0])
        if not m:
            continue  # NIC rows repeat what the GPU rows say
        values = cells[1:]
        if len(values) < sum(1 for c in columns if _GPU.match(c)):
            raise DiscoveryError(f"nvidia-smi topo -m row {cells[0]} is shorter than the header, line {number_}")
        gpu = TopoGpu(index=int(m.group(1)))
        for column, value in zip(columns, values, strict=False):
            _cell(topo, gpu, column, value)
        if gpu.index in topo.gpus:
            raise DiscoveryError(f"nvidia-smi topo -m lists {cells[0]} twice, line {number_}")
        topo.gpus[gpu.index] = gpu
    if not topo.gpus:
        raise DiscoveryError("nvidia-smi topo -m output has no GPU rows")
    return topo


def _cell(topo: Topology, gpu: TopoGpu, column: str, value: str) -> None:
    peer = _GPU.match(column)
    if peer:
        nv = _NV.match(value)
        if nv and int(peer.group(1)) != gpu.index:
            gpu.nvlinks[int(peer.group(1))] = int(nv.group(1))
        return
    lowered = column.lower()
    if lowered == "cpu affinity":
        gpu.cpu_affinity = None if value.upper() == "N/A" else value
        return
    if lowered == "numa affinity":
        gpu.numa = _numa(value)
        return
    if lowered in ("gpu numa id",) or "affinity" in lowered:
        return
    # Anything else is a NIC column: NICn (named by the legend) or the device name itself.
    name = topo.nic_names.get(column, column) if _NIC.match(column) else column
    kind = _ALIASES.get(value.upper(), value.upper())
    if kind in NEARNESS:
        gpu.nics[name] = kind
