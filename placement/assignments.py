"""What each node is told to run: its shards, as the heartbeat answer carries them."""

from __future__ import annotations

import threading
from collections.abc import Iterable

from catalog.models import Adapter
from core.fingerprints import set_fingerprint, set_fingerprint_of
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
    shards = _running()
    if node_ids is not None:
        shards = shards.filter(node_id__in=node_ids)
    rows = list(shards.order_by(*_ORDER).values_list(*_COLUMNS))
    wanted = {row[_MODEL_ID] for row in rows}
    adapters = Adapter.objects.filter(model_id__in=wanted) if wanted else Adapter.objects.none()
    return _table(rows, adapters.order_by("model_id", "name").values_list(*_ADAPTER_COLUMNS))


def _running():
    return Shard.objects.exclude(replica__state=ReplicaState.STOPPING)


def _table(rows: Iterable[tuple], adapter_rows: Iterable[tuple]) -> dict[int, list[dict]]:
    adapters: dict[int, list[tuple[str, str]]] = {}
    for model_id, name, source in adapter_rows:  # in the model's order (by name), as model.adapters.all() gives them
        adapters.setdefault(model_id, []).append((name, source))
    table: dict[int, list[dict]] = {}
    for row in rows:
        table.setdefault(row[0], []).append(_describe(row, adapters.get(row[_MODEL_ID], ())))
    return table


class KeptTable:
    """:func:`for_nodes` for every node, read again only when the rows it is made of changed.

    Each admin process answers heartbeats from this table and asks for it
    once a second. The database works out the fingerprint of its rows (every
    running shard's, every adapter's: ``core.fingerprints``); while both are
    those of the rows it was made from, the table is handed out as it is,
    the very object, and nothing is read or built. A table is kept with the
    fingerprints read in the statements that read its rows, never earlier
    ones. With 7,900 replicas at 10,000 nodes the reading took each admin
    process 0.06 to 0.13 s of CPU a second; the two fingerprints take
    PostgreSQL some 25 ms.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kept: tuple[tuple[str | None, str | None], dict[int, list[dict]]] | None = None

    def table(self) -> dict[int, list[dict]]:
        """Every node's shards, as :func:`for_nodes` gives them now; read them, never change them."""
        with self._lock:
            kept = self._kept
            if kept is not None:
                now = (set_fingerprint(_running(), *_SHARDS), set_fingerprint(Adapter.objects, *_ADAPTERS))
                if now == kept[0]:
                    return kept[1]
            self._kept = self._read()
            return self._kept[1]

    @staticmethod
    def _read() -> tuple[tuple[str | None, str | None], dict[int, list[dict]]]:
        shards_fp = adapters_fp = None
        rows = []
        query = _running().annotate(fp=set_fingerprint_of(_running(), *_SHARDS)).order_by(*_ORDER)
        for *row, fp in query.values_list(*_COLUMNS, "fp"):
            rows.append(tuple(row))
            shards_fp = fp
        adapter_rows = []
        adapters = Adapter.objects.annotate(fp=set_fingerprint_of(Adapter.objects, *_ADAPTERS)).order_by(*_ADAPTERS[0])
        for *row, fp in adapters.values_list(*_ADAPTER_COLUMNS, "fp"):
            adapter_rows.append(tuple(row))
            adapters_fp = fp
        return (shards_fp, adapters_fp), _table(rows, adapter_rows)


kept_table = KeptTable()


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
_ORDER = ("replica_id", "rank")
_ADAPTER_COLUMNS = ("model_id", "name", "source")
# Each table's order (unique: a replica's ranks, a model's adapter names), then the columns its fingerprint follows.
_SHARDS = (_ORDER, *_COLUMNS)
_ADAPTERS = (("model_id", "name"), *_ADAPTER_COLUMNS)


def heartbeat_tables(sender, **kwargs) -> HeartbeatTables:
    """``heartbeat_answers_wanted``: every node's shards, for the heartbeat desk's copy (see :class:`KeptTable`)."""
    return HeartbeatTables(shards=kept_table.table())


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
