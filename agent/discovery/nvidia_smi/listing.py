"""``nvidia-smi -L``: the one-line-a-card listing, and the fabric block of ``nvidia-smi -q``."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from agent.discovery.errors import DiscoveryError
from agent.discovery.nvidia_smi.text import _fabric_text, _Node, _outline

# ---------------------------------------------------------------------------
# nvidia-smi -L


@dataclass
class ListedMig:
    """``MIG 1g.12gb Device 0: (UUID: MIG-…)`` under a GPU line."""

    device: int
    profile: str
    uuid: str


@dataclass
class ListedGpu:
    index: int
    name: str
    uuid: str | None
    migs: list[ListedMig] = field(default_factory=list)


@dataclass
class SmiListing:
    gpus: list[ListedGpu] = field(default_factory=list)


_L_GPU = re.compile(r"^GPU\s+(\d+):\s*(.*?)\s*(?:\(UUID:\s*([^)\s]+)\s*\))?\s*$")
_L_MIG = re.compile(r"^MIG\s+(\S+)\s+Device\s+(\d+):\s*\(UUID:\s*([^)\s]+)\s*\)\s*$")


def parse_list(text: str) -> SmiListing:
    """Parse ``nvidia-smi -L``.

    Lines may carry a leading ``#`` and indentation (a listing pasted into a
    YAML comment) and unrelated lines are skipped; a MIG line before any GPU
    line, or a text with no GPU line at all, is an error.
    """
    if text is None or not text.strip():
        raise DiscoveryError("nvidia-smi -L output is empty")
    listing = SmiListing()
    for number_, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip().lstrip("#").strip()
        if not line:
            continue
        m = _L_GPU.match(line)
        if m:
            listing.gpus.append(ListedGpu(index=int(m.group(1)), name=m.group(2), uuid=m.group(3)))
            continue
        m = _L_MIG.match(line)
        if m:
            if not listing.gpus:
                raise DiscoveryError(f"nvidia-smi -L output lists a MIG device before any GPU, line {number_}")
            listing.gpus[-1].migs.append(ListedMig(device=int(m.group(2)), profile=m.group(1), uuid=m.group(3)))
    if not listing.gpus:
        raise DiscoveryError("nvidia-smi -L output has no 'GPU N: name (UUID: …)' line")
    indices = [g.index for g in listing.gpus]
    if len(set(indices)) != len(indices):
        raise DiscoveryError("nvidia-smi -L output lists the same GPU index twice")
    return listing


def parse_fabric_block(text: str) -> dict[str, str]:
    """The ``Fabric`` section of ``nvidia-smi -q`` on its own (a grep, a pasted fragment), flattened as in SmiGpu.

    Lines outside the section are ignored (grep's ``--`` separators, the command line).
    """
    lines = [raw for raw in (text or "").splitlines() if raw.strip() and not raw.lstrip().startswith(("#", "--"))]
    roots = _outline(lines)
    holder = _Node(key="GPU", value=None, indent=-1, children=roots)
    fabric = _fabric_text(holder)
    if fabric is None:
        raise DiscoveryError("text has no 'Fabric' section")
    return fabric
