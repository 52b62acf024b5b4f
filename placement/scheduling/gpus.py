"""Which of a node's free GPUs a shard gets, and the environment its engine runs with.

A shard's GPUs should reach each other over NVLink and sit on as few NUMA
nodes as possible: tensor parallelism all-reduces on every layer, and a hop
over PCIe or across sockets shows up in every token. Both are preferences —
a PCIe card has no NVLink to offer — so a choice is scored, and the scheduler
looks for a node where the score is as good as that node could ever give.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import combinations

from catalog.definitions import ProfileSpec
from placement.scheduling.types import GpuInfo

# (some pair of the GPUs is not NVLinked, NUMA nodes spanned): lower is better.
Quality = tuple[bool, int]

# Above this many free GPUs, trying every combination costs more than it saves.
COMBINATIONS_UP_TO = 12


def pick(free: Sequence[GpuInfo], need: int) -> tuple[tuple[GpuInfo, ...], Quality]:
    """The ``need`` GPUs of ``free`` (sorted by index, ``len(free) >= need``) a shard should get."""
    if need == 1 and len(free) > 1:
        # One GPU: no pair to link, one NUMA node; the fullest NUMA node's first, as _pack_numa picks.
        return (_pack_numa(free, 1)[0],), (False, 1)
    linked = _all_linked(free)
    if need >= len(free):
        chosen: Sequence[GpuInfo] = free
    elif linked or len(free) > COMBINATIONS_UP_TO:
        chosen = _pack_numa(free, need)
    else:
        chosen = min(combinations(free, need), key=lambda c: (quality(c), [g.index for g in c]))
    ordered = tuple(sorted(chosen, key=lambda g: g.index))
    # Every subset of GPUs that all reach each other does too.
    return ordered, (False, _numa_span(ordered)) if linked else quality(ordered)


def quality(gpus: Sequence[GpuInfo]) -> Quality:
    return (not _all_linked(gpus), _numa_span(gpus))


def _numa_span(gpus: Sequence[GpuInfo]) -> int:
    return max(1, len({g.numa for g in gpus if g.numa is not None}))


def _linked(a: GpuInfo, b: GpuInfo) -> bool:
    """Unknown peers (None) count as linked: we cannot prefer what we cannot see."""
    if a.nvlink_peers is not None and b.index not in a.nvlink_peers:
        return False
    return not (b.nvlink_peers is not None and a.index not in b.nvlink_peers)


def _all_linked(gpus: Sequence[GpuInfo]) -> bool:
    """Every pair linked (``_linked``): each GPU that reports peers names every other GPU's index among them."""
    indices = {g.index for g in gpus}
    if len(indices) != len(gpus):
        return all(_linked(a, b) for a, b in combinations(gpus, 2))
    for g in gpus:
        peers = g.nvlink_peers
        if peers is not None and not peers.issuperset(indices - {g.index}):
            return False
    return True


def _numa_key(numa: int | None) -> tuple[bool, int]:
    return (numa is None, numa or 0)


def _pack_numa(free: Sequence[GpuInfo], need: int) -> list[GpuInfo]:
    """Fill from one NUMA node if one has room — the fullest that fits, to keep others whole — else the fewest."""
    groups: dict[int | None, list[GpuInfo]] = {}
    for g in free:
        groups.setdefault(g.numa, []).append(g)
    fitting = [n for n, gs in groups.items() if len(gs) >= need]
    if fitting:
        best = min(fitting, key=lambda n: (len(groups[n]), _numa_key(n)))
        return groups[best][:need]
    chosen: list[GpuInfo] = []
    for n in sorted(groups, key=lambda n: (-len(groups[n]), _numa_key(n))):
        chosen.extend(groups[n][: need - len(chosen)])
        if len(chosen) == need:
            break
    return chosen


def visible_devices(gpus: Sequence[GpuInfo]) -> str:
    """``CUDA_VISIBLE_DEVICES``: indices for cards, ``MIG-<uuid>`` for a MIG instance."""
    ids = []
    for g in gpus:
        if g.parent is None:
            ids.append(str(g.index))
        else:
            ids.append(g.mig_uuid if g.mig_uuid.startswith("MIG-") else f"MIG-{g.mig_uuid}")
    return ",".join(ids)


def shard_env(
    profile: ProfileSpec,
    gpus: Sequence[GpuInfo],
    *,
    rank: int = 0,
    nodes: Sequence[str] = (),
    mnnvl: bool = False,
) -> Mapping[str, str]:
    """The environment one shard's engine gets: the profile's, then what placement decided.

    Placement's keys win over the profile's: a profile that set
    CUDA_VISIBLE_DEVICES itself would otherwise put two replicas on one card.
    """
    env = dict(profile.env)
    if not gpus:
        # A CPU engine on a GPU machine must not pick up cards other replicas own.
        env["CUDA_VISIBLE_DEVICES"] = ""
    elif any(g.parent is not None for g in gpus):
        env["CUDA_VISIBLE_DEVICES"] = visible_devices(gpus)
    else:
        # CUDA numbers cards fastest-first unless told otherwise; the indices
        # are nvidia-smi's, which are in PCI bus order.
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        env["CUDA_VISIBLE_DEVICES"] = visible_devices(gpus)
    if len(nodes) > 1:
        # The agent turns these into the engine's own flags (torch.distributed
        # or Ray); the master is named, and the agent resolves its address.
        env["LLMGW_NODE_RANK"] = str(rank)
        env["LLMGW_NNODES"] = str(len(nodes))
        env["LLMGW_MASTER_NODE"] = nodes[0]
        if mnnvl:
            env["NCCL_MNNVL_ENABLE"] = "1"
    return env
