"""A shard as the control plane's heartbeat answer describes it (placement.assignments.for_node)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

# A shard id names its log file on this node: letters, digits, '-' and '_'
# only, so no id a control plane sends can name a path of its choosing.
SHARD_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,79}$")
# An adapter's name goes on the engine's command line as name=path: the catalog's names, never an '=' or a space.
ADAPTER_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")


class BadSpec(ValueError):
    """An assignment this agent cannot run as given, in one sentence."""


@dataclass(frozen=True)
class ShardSpec:
    """What to run. ``engine`` None means the control plane did not say: the shard fails with that reason.

    ``env`` is placement's environment for the engine (CUDA_VISIBLE_DEVICES,
    and for a multi-node shard LLMGW_NODE_RANK / LLMGW_NNODES /
    LLMGW_MASTER_NODE). ``tp``/``pp`` default to 1 when absent (an older
    control plane). ``api_key`` is the replica's secret, which the engine
    must require and the gateway sends; empty when the control plane gave
    none (an older one). It is never printed: it stays out of ``repr``.
    """

    id: str
    replica: str
    model: str
    rank: int = 0
    source: str = ""
    engine: str | None = None
    engine_args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    gpus: tuple[int, ...] = ()
    tp: int = 1
    pp: int = 1
    nodes: int = 1
    api_key: str = field(default="", repr=False)
    adapters: tuple[tuple[str, str], ...] = ()
    """The base model's LoRA adapters as (name, source), sorted by name: fetched and served beside the weights."""
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    @classmethod
    def from_assignment(cls, data: dict) -> ShardSpec:
        """The spec, or :class:`BadSpec` for an id that could name a path or a field of the wrong kind."""
        try:
            return cls._read(data)
        except BadSpec:
            raise
        except (TypeError, ValueError) as exc:
            raise BadSpec(f"the assignment {str(data.get('id'))[:80]!r} has a field of the wrong kind: {exc}") from None

    @classmethod
    def _read(cls, data: dict) -> ShardSpec:
        replica = str(data.get("replica") or "")
        rank = int(data.get("rank") or 0)
        shard_id = str(data.get("id") or f"{replica}-{rank}")
        if not SHARD_ID_RE.match(shard_id):
            raise BadSpec(f"shard id {shard_id[:80]!r} is not letters, digits, '-' and '_' (at most 80): not run")
        key = str(data.get("api_key") or "")
        if not key.isprintable() or " " in key:
            raise BadSpec(f"shard {shard_id}: its key is not one printable word: not run")
        env = data.get("env") if isinstance(data.get("env"), dict) else {}
        adapters = []
        for item in data.get("adapters") or ():
            if not isinstance(item, dict):
                raise BadSpec(f"shard {shard_id}: an adapter is not a mapping with name and source: not run")
            name, source = str(item.get("name") or ""), str(item.get("source") or "")
            if not ADAPTER_NAME_RE.match(name) or not source:
                raise BadSpec(f"shard {shard_id}: adapter {name[:80]!r} is not a name with a source: not run")
            adapters.append((name, source))
        return cls(
            id=shard_id,
            replica=replica,
            model=str(data.get("model") or ""),
            rank=rank,
            source=str(data.get("source") or ""),
            engine=data.get("engine") or None,
            engine_args=tuple(str(a) for a in data.get("engine_args") or ()),
            env=tuple(sorted((str(k), str(v)) for k, v in env.items())),
            gpus=tuple(int(g) for g in data.get("gpus") or ()),
            tp=int(data.get("tp") or 1),
            pp=int(data.get("pp") or 1),
            nodes=int(data.get("nodes") or 1),
            api_key=key,
            adapters=tuple(sorted(adapters)),
        )

    @property
    def environment(self) -> dict[str, str]:
        return dict(self.env)

    @property
    def multi_node(self) -> bool:
        return int(self.environment.get("LLMGW_NNODES", "1")) > 1

    def distributed_env(self, master_port: int = 29500) -> dict[str, str]:
        """The torch.distributed names for placement's multi-node facts; empty for one node.

        The master is named by its node name: the agents resolve it as a host
        name, as every node of a multi-node replica must reach the others.
        """
        env = self.environment
        if not self.multi_node:
            return {}
        return {
            "NODE_RANK": env["LLMGW_NODE_RANK"],
            "WORLD_SIZE": env["LLMGW_NNODES"],
            "MASTER_ADDR": env["LLMGW_MASTER_NODE"],
            "MASTER_PORT": str(master_port),
        }
