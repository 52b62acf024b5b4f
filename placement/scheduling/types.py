"""What the scheduler is given and what it decides, as plain frozen data.

The reconciler builds a :class:`Snapshot` from the database and applies the
:class:`Plan` it gets back; nothing here knows about either. Throughout,
``None`` means *unknown* — the agent or the catalog did not say — and is never
the same as empty, zero or false: an agent older than the engine probe has
``engines=None``, which is not "no engines".
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from catalog.definitions import ProfileSpec
from inventory.devices import mig_label

# Node states, as an operator sets them; reachability is separate.
READY = "ready"
CORDONED = "cordoned"
DRAINING = "draining"

# Replica states. Pending, starting and ready count toward a model's replicas:
# each is, or is on its way to, serving. Failed and stopping do not.
PENDING = "pending"
STARTING = "starting"
REPLICA_READY = "ready"
FAILED = "failed"
STOPPING = "stopping"
COUNTING_STATES = frozenset({PENDING, STARTING, REPLICA_READY})

# MIG instances are numbered past every real card (1000 + 100 × card + instance);
# the numbering and its label have one home, inventory's pure devices module.
gpu_label = mig_label


# --- input -------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuInfo:
    """One card, or one MIG instance of a card, as its node last reported it.

    ``parent`` is the card's index for a MIG instance (whose own index is
    ``1000 + 100 × card + instance``) and None for a card. ``mig_mode`` is
    True for a card in MIG mode: such a card is placed only through its
    instances, and one with no instances is out of placement altogether.

    ``numa`` and ``nvlink_peers`` are None when not reported; an empty
    ``nvlink_peers`` means the card has no active NVLink (a PCIe card).
    ``fabric_state``/``fabric_status`` are nvidia-smi's Fabric State and
    Status ("Completed"/"Success"), blank when the card reports no fabric.
    ``domain`` is the multi-node NVLink domain (``ClusterUUID/CliqueId``) the
    card has joined, None when it has joined none — including a single
    machine's NVSwitch, which reports an all-zero ClusterUUID.

    ``held`` is why card health holds the card (inventory.health_actions), None when it does
    not: a held card takes nothing new, and a replica on it is moved, replacement first.
    """

    index: int
    gpu_class: str
    uuid: str = ""
    healthy: bool = True
    problems: tuple[str, ...] = ()
    held: str | None = None
    numa: int | None = None
    nvlink_peers: frozenset[int] | None = None
    parent: int | None = None
    mig_uuid: str = ""
    mig_mode: bool = False
    fabric_state: str = ""
    fabric_status: str = ""
    domain: str | None = None
    degraded: bool | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeInfo:
    """A machine running the agent.

    ``engines`` holds the names of the engines installed (a mapping of name to
    version works too); None means the agent did not say, and such a node is
    treated as having any engine — treating it as having none would empty a
    fleet on the first control-plane upgrade. ``memory_mb`` None is unknown:
    a CPU profile is not placed on a node whose memory nobody knows.
    ``memory_reserved_mb`` is memory held back for the system and anything the
    snapshot does not describe; memory used by the snapshot's own CPU replicas
    is counted by the scheduler.

    ``imex_state`` is nvidia-imex's state as reported ("up" when running),
    None when not reported; ``imex_channels`` how many IMEX channels exist,
    None when not reported. ``fabric`` is the physical InfiniBand fabric the
    node's adapters are on (subnet manager, or RoCE network), None when none is
    known. ``labels["pool"]`` is the pool a profile can confine itself to.
    ``flapping`` is set on a ready node that has come back from a silence
    within the flap window: nothing new lands on it, what it runs stays.
    """

    name: str
    state: str = READY
    reachable: bool = True
    labels: Mapping[str, str] = field(default_factory=dict)
    engines: Collection[str] | None = None
    memory_mb: int | None = None
    memory_reserved_mb: int = 0
    imex_state: str | None = None
    imex_channels: int | None = None
    fabric: str | None = None
    gpus: tuple[GpuInfo, ...] = ()
    flapping: str | None = None
    """Why a node that went silent and came back takes nothing new ("flapping: 2 returns in 30 min"), from
    its first return until the cordon rule decides on it; None when it is not flapping."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelInfo:
    """A model in the catalog, with how many replicas it should have.

    ``profiles`` are the catalog's own :class:`~catalog.definitions.ProfileSpec`,
    in the order they are tried.

    ``wanted`` is demand beyond the minimum — the gateway asking for a min-0
    model on demand, or an autoscaler — clamped to [min, max]; None means no
    demand beyond the minimum. ``scale_to`` is the autoscaler's count from
    load (None: not autoscaled), ``scale_reason`` its reason in numbers; above
    it one replica is stopped per round. ``idle_timeout_s`` None means never scale down
    for idleness. ``parked_error`` set means the model's replicas failed at
    every start too many times in a row: nothing is placed for it until an
    operator acts, and this is the last error.
    """

    name: str
    profiles: tuple[ProfileSpec, ...]
    min_replicas: int = 1
    max_replicas: int = 1
    wanted: int | None = None
    idle_timeout_s: float | None = None
    parked_error: str | None = None
    scale_to: int | None = None
    scale_reason: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class ShardInfo:
    """The part of an existing replica on one node: its rank and GPU indices."""

    node: str
    rank: int = 0
    gpus: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaInfo:
    """An existing replica.

    ``fingerprint`` is the profile's fingerprint when the replica was placed,
    blank when not recorded (replicas adopted from older agents — never called
    stale). ``last_used_at`` None means no request was ever routed to it; its
    idleness then counts from ``ready_at`` (when it first became ready), else
    ``created_at``: the time a start takes is not idleness. ``replaces`` is the id of the
    replica this one was created to replace (a drain), None otherwise.
    """

    id: str
    model: str
    profile: str
    state: str
    shards: tuple[ShardInfo, ...]
    created_at: datetime
    fingerprint: str = ""
    last_used_at: datetime | None = None
    replaces: str | None = None
    ready_at: datetime | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Snapshot:
    """Everything the scheduler decides from. ``now`` is an input so a plan is reproducible.

    ``weights`` maps a model's name to the nodes whose disk holds a complete
    copy of its weights, as their agents last reported: among equally good
    candidates the scheduler prefers those, then nodes on their fabric
    (``placement.scheduling.warmth``). A model missing from it is held nowhere known.
    """

    nodes: tuple[NodeInfo, ...]
    models: tuple[ModelInfo, ...]
    replicas: tuple[ReplicaInfo, ...]
    now: datetime
    weights: Mapping[str, frozenset[str]] = field(default_factory=dict)


# --- output ------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class NewShard:
    """One shard of a replica to create: where it runs and the environment its engine gets."""

    node: str
    rank: int
    gpus: tuple[int, ...]
    env: Mapping[str, str]


@dataclass(frozen=True, slots=True, kw_only=True)
class NewReplica:
    """A replica to create. The reconciler gives it an id.

    ``nvlink_domain`` is set when its shards share one multi-node NVLink
    domain; ``fabric`` when they talk over one InfiniBand fabric instead.
    Both are None for a replica on one node.
    """

    model: str
    profile: str
    fingerprint: str
    shards: tuple[NewShard, ...]
    pool: str | None = None
    nvlink_domain: str | None = None
    fabric: str | None = None

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(s.node for s in self.shards)


@dataclass(frozen=True, slots=True, kw_only=True)
class StopDecision:
    """A replica to stop, and why in an operator's words."""

    replica_id: str
    model: str
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Replacement:
    """A replica to create in place of one on a draining node.

    The reconciler creates ``new`` recording ``replaces=old_replica_id``, and
    leaves the old one running: a later plan stops it once the replacement is
    ready, so a drain never leaves a model with fewer serving replicas.
    """

    old_replica_id: str
    new: NewReplica
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Rejection:
    """Why a candidate was turned down, as ``ExplainView`` shows it.

    ``node`` names the node when the reason is about one; it is None for a
    reason about the profile, a domain or a fabric, and for a group: when many
    nodes (or NVLink domains) are turned down for the same reason they become
    one line ("412 nodes: no h100-80g free (…)") with ``nodes`` saying how
    many candidates it stands for.
    """

    profile: str
    pool: str | None
    node: str | None
    reason: str
    nodes: int = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    """What the reconciler should do, and why some of it cannot be done.

    ``rejections`` explains, per model, every model it could not satisfy (and
    every drain it could not move). ``unplaceable`` names models left short of
    their desired replicas; ``parked`` maps parked models to their last error.
    ``stale`` lists replicas placed under a profile definition the catalog no
    longer holds — reported, not stopped: restarting a serving replica is the
    operator's call.
    """

    create: tuple[NewReplica, ...] = ()
    stop: tuple[StopDecision, ...] = ()
    replace: tuple[Replacement, ...] = ()
    stale: tuple[str, ...] = ()
    rejections: Mapping[str, tuple[Rejection, ...]] = field(default_factory=dict)
    unplaceable: tuple[str, ...] = ()
    parked: Mapping[str, str] = field(default_factory=dict)
