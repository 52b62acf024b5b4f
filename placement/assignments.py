"""What each node is told to run: its shards, as the heartbeat answer carries them."""

from __future__ import annotations

from collections.abc import Iterable

from catalog.models import Adapter
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
    """The shards each node should run, in two queries (shards, then their models' adapters); every node when
    ``node_ids`` is None.

    The heartbeat desk keeps this whole table per process, refreshed each
    flush, so answering a heartbeat never queries the database. Read as
    plain rows: through model instances and a prefetch, each flush of a
    fleet of 7,900 replicas took most of an admin process's CPU
    (bench/scale.py --replicas-first).
    """
    shards = Shard.objects.exclude(replica__state=ReplicaState.STOPPING)
    if node_ids is not None:
        shards = shards.filter(node_id__in=node_ids)
    rows = list(shards.order_by("replica_id", "rank").values_list(*_COLUMNS))
    adapters: dict[int, list[tuple[str, str]]] = {}
    wanted = {row[_MODEL_ID] for row in rows}
    if wanted:
        for model_id, name, source in Adapter.objects.filter(model_id__in=wanted).values_list(
            "model_id", "name", "source"
        ):  # in the model's order (by name), as model.adapters.all() gives them
            adapters.setdefault(model_id, []).append((name, source))
    table: dict[int, list[dict]] = {}
    for row in rows:
        table.setdefault(row[0], []).append(_describe(row, adapters.get(row[_MODEL_ID], ())))
    return table


# A shard's row: where it runs, what it is, and its replica's model and profile (None: the profile was removed).
_COLUMNS = (
    "node_id",
    "replica_id",
    "rank",
    "gpu_indices",
    "env",
    "replica__engine_key",
    "replica__model_id",
    "replica__model__name",
    "replica__model__source",
    "replica__profile_id",
    "replica__profile__engine",
    "replica__profile__engine_args",
    "replica__profile__tp",
    "replica__profile__pp",
    "replica__profile__nodes",
)
_MODEL_ID = _COLUMNS.index("replica__model_id")


def heartbeat_tables(sender, **kwargs) -> HeartbeatTables:
    """``heartbeat_answers_wanted``: every node's shards, for the heartbeat desk's copy (see :func:`for_nodes`)."""
    return HeartbeatTables(shards=for_nodes())


def _describe(row: tuple, adapters: Iterable[tuple[str, str]]) -> dict:
    (_, replica, rank, gpus, env, key, _, model, source, profile, engine, engine_args, tp, pp, nodes) = row
    known = profile is not None
    return {
        "id": f"{replica}-{rank}",
        "replica": replica,
        "model": model,
        "source": source,
        "rank": rank,
        "gpus": gpus,
        "env": env,
        "engine": engine if known else None,
        "engine_args": engine_args if known else [],
        "tp": tp if known else 1,
        "pp": pp if known else 1,
        "nodes": nodes if known else 1,
        "api_key": key,
        # The base model's LoRA adapters: the agent fetches them and starts the engine with them, or loads
        # one into a running engine that has room.
        "adapters": [{"name": name, "source": where} for name, where in adapters],
    }
