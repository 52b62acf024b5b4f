"""What each node is told to run: its shards, as the heartbeat answer carries them."""

from __future__ import annotations

from placement.models import ReplicaState, Shard


def for_node(node_id: int) -> list[dict]:
    """The shards ``node_id`` should be running now; the agent stops any others.

    A replica being stopped is left out, which is how its agent learns to stop
    it. ``engine`` None means the replica's profile was removed since it was
    placed: the agent reports that as the shard's failure.
    """
    shards = (
        Shard.objects.filter(node_id=node_id)
        .exclude(replica__state=ReplicaState.STOPPING)
        .select_related("replica__model", "replica__profile")
        .order_by("replica_id", "rank")
    )
    out = []
    for shard in shards:
        replica, profile = shard.replica, shard.replica.profile
        out.append(
            {
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
            }
        )
    return out
