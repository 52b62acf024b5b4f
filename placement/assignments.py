"""What each node is told to run: its shards, as the heartbeat answer carries them."""

from __future__ import annotations

from inventory.signals import HeartbeatTables
from placement.models import ReplicaState, Shard


def for_node(node_id: int) -> list[dict]:
    """The shards ``node_id`` should be running now; the agent stops any others.

    A replica being stopped is left out, which is how its agent learns to stop
    it. ``engine`` None means the replica's profile was removed since it was
    placed: the agent reports that as the shard's failure. ``api_key`` is the
    replica's engine key: this answer, to the node that runs the shard, is
    the only place it goes besides the gateway.
    """
    return for_nodes([node_id]).get(node_id, [])


def for_nodes(node_ids: list[int] | None = None) -> dict[int, list[dict]]:
    """The shards each node should run, in one query; every node when ``node_ids`` is None.

    The heartbeat desk keeps this whole table per process, refreshed each
    flush, so answering a heartbeat never queries the database.
    """
    shards = Shard.objects.exclude(replica__state=ReplicaState.STOPPING)
    if node_ids is not None:
        shards = shards.filter(node_id__in=node_ids)
    table: dict[int, list[dict]] = {}
    rows = shards.select_related("replica__model", "replica__profile").prefetch_related("replica__model__adapters")
    for shard in rows.order_by("replica_id", "rank"):
        table.setdefault(shard.node_id, []).append(_describe(shard))
    return table


def heartbeat_tables(sender, **kwargs) -> HeartbeatTables:
    """``heartbeat_answers_wanted``: every node's shards, for the heartbeat desk's copy (see :func:`for_nodes`)."""
    return HeartbeatTables(shards=for_nodes())


def _describe(shard: Shard) -> dict:
    replica, profile = shard.replica, shard.replica.profile
    return {
        "id": f"{replica.id}-{shard.rank}",
        "replica": replica.id,
        "model": replica.model.name,
        "source": replica.model.source,
        "rank": shard.rank,
        "gpus": shard.gpu_indices,
        "env": shard.env,
        "engine": profile.engine if profile else None,
        "engine_args": profile.engine_args if profile else [],
        "tp": profile.tp if profile else 1,
        "pp": profile.pp if profile else 1,
        "nodes": profile.nodes if profile else 1,
        "api_key": replica.engine_key,
        # The base model's LoRA adapters: the agent fetches them and starts the engine with them, or loads
        # one into a running engine that has room.
        "adapters": [{"name": a.name, "source": a.source} for a in replica.model.adapters.all()],
    }
