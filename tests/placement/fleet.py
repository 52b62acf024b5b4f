"""Small named fleets for the scheduler's tests: an HGX box, a GB200 NVL72 rack, a MIG card, a CPU node.

Each builder returns plain scheduler input with the shape of the real thing
(an HGX H100 has eight cards on two NUMA nodes, all NVLinked through its
NVSwitch, which reports an all-zero ClusterUUID and so no domain; a GB200 tray
has four cards that join the rack's domain), with keyword arguments for the
one thing a test wants broken.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from catalog import rules
from placement.scheduler import (
    GpuInfo,
    ModelInfo,
    NodeInfo,
    Plan,
    ProfileSpec,
    ReplicaInfo,
    ShardInfo,
    Snapshot,
)

NOW = datetime(2026, 10, 5, 12, 0, tzinfo=UTC)
AN_HOUR_AGO = NOW - timedelta(hours=1)


def hgx_h100(
    name: str,
    *,
    fabric: str | None = "ib-east",
    state: str = "ready",
    reachable: bool = True,
    engines: Iterable[str] | None = ("vllm", "sglang"),
    pool: str | None = None,
    unhealthy: Mapping[int, str] | None = None,
    gpu_class: str = "h100-80g",
    cards: int = 8,
) -> NodeInfo:
    """An 8-GPU HGX machine: cards 0–3 on NUMA 0, 4–7 on NUMA 1, every card NVLinked to every other."""
    unhealthy = unhealthy or {}
    gpus = tuple(
        GpuInfo(
            index=i,
            uuid=f"GPU-{name}-{i}",
            gpu_class=gpu_class,
            healthy=i not in unhealthy,
            problems=(unhealthy[i],) if i in unhealthy else (),
            numa=i * 2 // cards,
            nvlink_peers=frozenset(range(cards)) - {i},
            fabric_state="Completed",
            fabric_status="Success",
        )
        for i in range(cards)
    )
    return _node(name, gpus, state, reachable, engines, pool, fabric=fabric, memory_gb=2048)


def pcie_box(name: str, *, bridges: Sequence[tuple[int, int]] = ((0, 1), (2, 3), (4, 5), (6, 7))) -> NodeInfo:
    """PCIe A100s joined in pairs by NVLink bridges, all on one NUMA node."""
    peers: dict[int, set[int]] = {i: set() for i in range(8)}
    for a, b in bridges:
        peers[a].add(b)
        peers[b].add(a)
    gpus = tuple(
        GpuInfo(index=i, gpu_class="a100-80g", uuid=f"GPU-{name}-{i}", numa=0, nvlink_peers=frozenset(peers[i]))
        for i in range(8)
    )
    return _node(name, gpus, "ready", True, ("vllm",), None, fabric=None, memory_gb=512)


def domain_key(rack: str) -> str:
    """The NVLink domain of a rack, named as the inventory names domains: ClusterUUID/CliqueId."""
    return f"{rack}-cluster-uuid/32766"


def nvl72_rack(
    rack: str = "rack-a",
    *,
    trays: int = 18,
    fabric: str | None = "ib-gb",
    imex: str | None = "up",
    not_joined: Mapping[int, Mapping[int, str]] | None = None,
    imex_down: Iterable[int] = (),
    degraded: Iterable[int] = (),
    engines: Iterable[str] | None = ("vllm", "sglang"),
) -> list[NodeInfo]:
    """A GB200 NVL72: 18 trays of 4 GPUs, every card joined to the rack's one ClusterUUID/CliqueId.

    ``not_joined={5: {3: "In Progress"}}`` leaves tray 5's GPU 3 still joining.
    """
    not_joined = not_joined or {}
    down, amber = set(imex_down), set(degraded)
    nodes = []
    for t in range(trays):
        gpus = []
        for i in range(4):
            state = not_joined.get(t, {}).get(i)
            gpus.append(
                GpuInfo(
                    index=i,
                    uuid=f"GPU-{rack}-{t}-{i}",
                    gpu_class="gb200-186g",
                    numa=i // 2,
                    nvlink_peers=frozenset(range(4)) - {i},
                    fabric_state=state or "Completed",
                    fabric_status="Success" if state is None else "N/A",
                    domain=None if state else domain_key(rack),
                    degraded=t in amber,
                )
            )
        node = _node(tray(rack, t), tuple(gpus), "ready", True, engines, None, fabric=fabric, memory_gb=880)
        nodes.append(_replace_imex(node, "down" if t in down else imex))
    return nodes


def tray(rack: str, t: int) -> str:
    return f"{rack}-tray{t:02d}"


def a100_mig(
    name: str,
    *,
    carved: Mapping[int, Sequence[str]] | None = None,
    empty_mig: Iterable[int] = (),
    engines: Iterable[str] | None = ("vllm",),
) -> NodeInfo:
    """Eight A100 80GB cards; ``carved={0: ["3g.40gb", "3g.40gb"]}`` puts card 0 in MIG mode with two instances.

    Cards in ``empty_mig`` are in MIG mode with nothing carved; the rest are whole.
    """
    carved = carved or {}
    empty = set(empty_mig)
    gpus: list[GpuInfo] = []
    for card in range(8):
        in_mig = card in carved or card in empty
        gpus.append(
            GpuInfo(index=card, gpu_class="a100-80g", uuid=f"GPU-{name}-{card}", numa=card // 4, mig_mode=in_mig)
        )
        for n, profile in enumerate(carved.get(card, ())):
            gpus.append(
                GpuInfo(
                    index=1000 + 100 * card + n,
                    gpu_class=f"a100-80g-mig-{profile}",
                    uuid=f"GPU-{name}-{card}",
                    parent=card,
                    mig_uuid=mig_uuid(name, card, n),
                    numa=card // 4,
                )
            )
    return _node(name, tuple(gpus), "ready", True, engines, None, fabric=None, memory_gb=1024)


def mig_uuid(node: str, card: int, instance: int) -> str:
    return f"MIG-{node}-{card}-{instance}"


def cpu_box(
    name: str,
    *,
    memory_gb: int | None = 256,
    engines: Iterable[str] | None = ("llamacpp",),
    state: str = "ready",
    pool: str | None = None,
) -> NodeInfo:
    return _node(name, (), state, True, engines, pool, fabric=None, memory_gb=memory_gb)


def _node(
    name: str,
    gpus: tuple[GpuInfo, ...],
    state: str,
    reachable: bool,
    engines: Iterable[str] | None,
    pool: str | None,
    *,
    fabric: str | None,
    memory_gb: int | None,
) -> NodeInfo:
    return NodeInfo(
        name=name,
        state=state,
        reachable=reachable,
        labels={"pool": pool} if pool else {},
        engines=None if engines is None else frozenset(engines),
        memory_mb=None if memory_gb is None else memory_gb * 1024,
        fabric=fabric,
        gpus=gpus,
    )


def _replace_imex(node: NodeInfo, state: str | None) -> NodeInfo:
    return replace(node, imex_state=state, imex_channels=1 if state else None)


def profile(
    name: str = "default",
    *,
    gpu_class: str = "h100-80g",
    gpus: int = 1,
    nodes: int = 1,
    tp: int | None = None,
    pp: int = 1,
    engine: str = "vllm",
    memory_gb: float | None = None,
    pool: str | None = None,
    env: Mapping[str, str] | None = None,
) -> ProfileSpec:
    """A profile with its fingerprint taken as the catalog takes it; tp defaults to every GPU."""
    if tp is None:
        tp = max(gpus, 1) * nodes // pp
    spec = ProfileSpec(
        name=name,
        engine=engine,
        gpu_class=gpu_class,
        gpus=gpus,
        nodes=nodes,
        tp=tp,
        pp=pp,
        memory_gb=memory_gb,
        pool=pool or "",
        env=tuple(sorted((env or {}).items())),
    )
    return replace(spec, fingerprint=rules.fingerprint(spec.definition()))


def cpu_profile(name: str = "cpu", *, memory_gb: float = 48, engine: str = "llamacpp") -> ProfileSpec:
    return profile(name, gpu_class="cpu", gpus=0, tp=1, engine=engine, memory_gb=memory_gb)


def model(
    name: str,
    *profiles: ProfileSpec,
    min_replicas: int = 1,
    max_replicas: int | None = None,
    wanted: int | None = None,
    idle_timeout_s: float | None = None,
    parked_error: str | None = None,
) -> ModelInfo:
    return ModelInfo(
        name=name,
        profiles=profiles or (profile(),),
        min_replicas=min_replicas,
        max_replicas=max(min_replicas, 1) if max_replicas is None else max_replicas,
        wanted=wanted,
        idle_timeout_s=idle_timeout_s,
        parked_error=parked_error,
    )


def replica(
    rid: str,
    of: ModelInfo,
    *shards: tuple[str, Sequence[int]],
    state: str = "ready",
    created_at: datetime = AN_HOUR_AGO,
    last_used_at: datetime | None = None,
    profile_name: str | None = None,
    fingerprint: str | None = None,
    replaces: str | None = None,
) -> ReplicaInfo:
    """A replica of ``of`` on ``shards`` — ``("node", [gpu indices])`` each, ranked in order."""
    p = next((p for p in of.profiles if p.name == profile_name), of.profiles[0])
    return ReplicaInfo(
        id=rid,
        model=of.name,
        profile=p.name,
        fingerprint=p.fingerprint if fingerprint is None else fingerprint,
        state=state,
        shards=tuple(ShardInfo(node=n, rank=r, gpus=tuple(g)) for r, (n, g) in enumerate(shards)),
        created_at=created_at,
        last_used_at=last_used_at,
        replaces=replaces,
    )


def snapshot(
    nodes: Iterable[NodeInfo],
    models: Iterable[ModelInfo],
    replicas: Iterable[ReplicaInfo] = (),
    now: datetime = NOW,
) -> Snapshot:
    return Snapshot(nodes=tuple(nodes), models=tuple(models), replicas=tuple(replicas), now=now)


def reasons(plan: Plan, model_name: str) -> list[str]:
    """A model's rejections as people read them: ``node: reason``, or the reason alone."""
    return [f"{r.node}: {r.reason}" if r.node else r.reason for r in plan.rejections.get(model_name, ())]


def placed_on(plan: Plan, model_name: str) -> list[list[tuple[str, tuple[int, ...]]]]:
    """For each replica created for a model, its shards as (node, gpus)."""
    return [[(s.node, s.gpus) for s in r.shards] for r in plan.create if r.model == model_name]
