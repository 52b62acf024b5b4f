"""What the gateway knows of the catalog and the ready replicas, cached per process.

Read from the database at most every LLMGW_GATEWAY_REFRESH_S, and at once
when a request names a model the cache does not know or finds no ready
replica: a model just added, or a replica just marked ready, is served on its
first request. A replica that stopped since the last read is found out by
the request that tries it, which then moves on to another.

Keys are never cached here: see gateway.writes.keys.authenticate.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from catalog.models import Adapter, Alias, CatalogModel, Fallback
from gateway import anthropic
from gateway.models import Price
from placement.models import Replica, ReplicaState


@dataclass(frozen=True)
class ModelEntry:
    id: int
    name: str
    aliases: tuple[str, ...]
    on_demand: bool
    created: int
    fallbacks: tuple[str, ...] = ()
    price: tuple[int, int] | None = None
    """Micros per million prompt and completion tokens; None: no price set, free."""
    base: str = ""
    """For a LoRA adapter, its base model's name (``id`` is then the base's, whose replicas serve it);
    empty for a model."""

    @property
    def serving(self) -> str:
        """The catalog model whose replicas serve this name: the base of an adapter, else the model itself.

        Demand, load and waiting for a replica are counted for it, so an
        adapter's traffic scales its base model.
        """
        return self.base or self.name


@dataclass(frozen=True)
class ReplicaEntry:
    id: str
    endpoint: str
    native: frozenset[str] = frozenset()
    """The /v1 endpoints beyond OpenAI's its engine serves itself (``messages``); others are translated for."""
    adapters: frozenset[str] = frozenset()
    """The LoRA adapters its engine has loaded, as its agent last reported."""
    engine: str = ""

    @property
    def switch_reloads(self) -> bool:
        """Serving another model name than the last costs a reload of the model: llama-cpp-python's server
        holds one at a time, each adapter a name of its own (agent.supervisor.llamacpp)."""
        return self.engine == "llamacpp"

    def upstream_name(self, model: ModelEntry) -> str:
        """What this engine calls ``model``: the catalog's name, and an adapter's own name to vLLM (its
        ``--lora-modules`` name) but ``<base>:<adapter>`` to SGLang, which serves its adapters so."""
        if model.base and self.engine == "sglang":
            return f"{model.base}:{model.name}"
        return model.name


@dataclass(frozen=True)
class Snapshot:
    models: dict[str, ModelEntry] = field(default_factory=dict)
    by_name: dict[str, ModelEntry] = field(default_factory=dict)
    """Every name and alias to its model, and every adapter's name to its own entry."""
    adapters: dict[str, ModelEntry] = field(default_factory=dict)
    """The LoRA adapters by name, each with its base model's id."""
    replicas: dict[int, tuple[ReplicaEntry, ...]] = field(default_factory=dict)
    """Ready replicas with an endpoint, by model id; absent: none is ready."""
    engine_keys: dict[tuple[str, int], str] = field(default_factory=dict, repr=False)
    """Each ready engine's key by its (host, port), for upstream.Client to send."""
    taken_at: float = 0.0


def load() -> Snapshot:
    """Read the catalog and the ready replicas (six queries, whatever their size)."""
    aliases: dict[int, list[str]] = {}
    for model_id, name in Alias.objects.values_list("model_id", "name"):
        aliases.setdefault(model_id, []).append(name)
    fallbacks: dict[int, list[str]] = {}
    for model_id, target in Fallback.objects.order_by("model_id", "position").values_list("model_id", "target__name"):
        fallbacks.setdefault(model_id, []).append(target)
    prices: dict[int, tuple[int, int]] = {}
    adapter_prices: dict[int, tuple[int, int]] = {}
    for m, a, p, c in Price.objects.values_list(
        "model_id", "adapter_id", "prompt_micros_per_million", "completion_micros_per_million"
    ):
        if m is not None:
            prices[m] = (p, c)
        else:
            adapter_prices[a] = (p, c)
    models: dict[str, ModelEntry] = {}
    by_name: dict[str, ModelEntry] = {}
    for model_id, name, min_replicas, created in CatalogModel.objects.values_list(
        "id", "name", "min_replicas", "created_at"
    ):
        entry = ModelEntry(
            id=model_id,
            name=name,
            aliases=tuple(sorted(aliases.get(model_id, []))),
            on_demand=min_replicas == 0,
            created=int(created.timestamp()),
            fallbacks=tuple(fallbacks.get(model_id, [])),
            price=prices.get(model_id),
        )
        models[name] = entry
        by_name[name] = entry
        for alias in entry.aliases:
            by_name[alias] = entry
    bases = {m.id: m for m in models.values()}
    adapters: dict[str, ModelEntry] = {}
    for adapter_id, name, model_id in Adapter.objects.values_list("id", "name", "model_id"):
        base = bases.get(model_id)
        if base is None:
            continue  # its base was added after the models were read: the next refresh has both
        # Served by its base's replicas (the same id), started on demand as its base is, and priced on its own.
        entry = ModelEntry(
            id=base.id,
            name=name,
            aliases=(),
            on_demand=base.on_demand,
            created=base.created,
            price=adapter_prices.get(adapter_id),
            base=base.name,
        )
        adapters[name] = entry
        by_name.setdefault(name, entry)
    replicas: dict[int, list[ReplicaEntry]] = {}
    engine_keys: dict[tuple[str, int], str] = {}
    ready = Replica.objects.filter(state=ReplicaState.READY).exclude(endpoint="").order_by("created_at")
    rows = ready.values_list("id", "model_id", "endpoint", "engine_key", "profile__engine", "adapters")
    for replica_id, model_id, endpoint, key, engine, loaded in rows:
        native = frozenset({"messages"} if anthropic.serves_messages(engine) else ())
        loaded = frozenset(n for n in loaded if isinstance(n, str)) if isinstance(loaded, list) else frozenset()
        entry = ReplicaEntry(replica_id, endpoint.rstrip("/"), native, loaded, engine or "")
        replicas.setdefault(model_id, []).append(entry)
        address = _address(endpoint)
        if address is not None and key:
            engine_keys[address] = key
    return Snapshot(
        models=models,
        by_name=by_name,
        adapters=adapters,
        replicas={m: tuple(r) for m, r in replicas.items()},
        engine_keys=engine_keys,
        taken_at=time.monotonic(),
    )


def _address(endpoint: str) -> tuple[str, int] | None:
    """(host, port) as upstream.Client keys its connections; None for an endpoint it could not use anyway."""
    try:
        parts = urlsplit(endpoint)
        return (parts.hostname, parts.port or 80) if parts.hostname else None
    except ValueError:
        return None


class Directory:
    """The cached snapshot, refreshed by one reader at a time.

    ``run_db`` runs a function on the gateway's database threads; requests
    arriving during a refresh wait for that refresh instead of starting
    their own.
    """

    def __init__(self, run_db, max_age_s: float) -> None:
        self.run_db = run_db
        self.max_age_s = max_age_s
        self.snapshot = Snapshot()
        self._refreshing: asyncio.Future | None = None

    def engine_key(self, address: tuple[str, int]) -> str | None:
        """The key of the engine at ``address`` as of the current snapshot (upstream.Client's ``keys``)."""
        return self.snapshot.engine_keys.get(address)

    async def current(self) -> Snapshot:
        if time.monotonic() - self.snapshot.taken_at > self.max_age_s:
            return await self.refresh()
        return self.snapshot

    async def refresh(self, *, newer_than: float | None = None) -> Snapshot:
        """A fresh snapshot; one taken after ``newer_than`` (monotonic) is fresh enough."""
        if newer_than is not None and self.snapshot.taken_at > newer_than:
            return self.snapshot
        if self._refreshing is None:
            self._refreshing = asyncio.ensure_future(self._load())
        future = self._refreshing
        try:
            return await asyncio.shield(future)
        finally:
            if future.done() and self._refreshing is future:
                self._refreshing = None

    async def _load(self) -> Snapshot:
        self.snapshot = await self.run_db(load)
        return self.snapshot
