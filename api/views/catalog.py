"""The catalog: list, add, remove and scale models; store and list measured capacity.

Every change goes through ``catalog.writes``, the one path the admin, the
YAML loader and this API share; its refusals carry their status and sentence.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from django.db import DataError, IntegrityError, transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework.response import Response

from api.base import ApiView, Refused
from api.serializers.catalog import (
    CapacityRequestSerializer,
    CapacitySerializer,
    ModelSerializer,
    PrefetchAnswerSerializer,
    PrefetchRequestSerializer,
    RemovedSerializer,
    ScaleRequestSerializer,
    ScaleSerializer,
)
from api.serializers.common import ERRORS, WRITE_ERRORS
from catalog import prefetch
from catalog import writes as service
from catalog.definitions import parse_duration
from catalog.models import CapacityMeasurement
from catalog.reads import capacity_list, capacity_view, prefetch_view
from placement.reads import model_list

T = TypeVar("T")
# Far beyond any fleet, well inside the column: a larger number is a typo.
MAX_REPLICAS = 100_000


def catalog_call(call: Callable[[], T]) -> T:
    """Run a catalog change, turning its refusals into answers.

    The database errors are a last line: the definition checks bound every
    number and name, but a value the store cannot hold must still be the
    client's 400, never a 500.
    """
    try:
        return call()
    except service.CatalogError as exc:
        raise Refused(exc.status, exc.message) from None
    except (DataError, IntegrityError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise Refused(
            400, f"the store cannot hold a value in this request ({first}); check the numbers and names"
        ) from None


def model_answer(name: str) -> dict[str, Any]:
    return model_list(name)[0]


class ModelListView(ApiView):
    @extend_schema(operation_id="models", summary="Every model", responses={200: ModelSerializer(many=True), **ERRORS})
    def get(self, request):
        return Response(model_list())

    @extend_schema(
        operation_id="add_model",
        summary="Add a model from its definition (the YAML shape, as JSON)",
        request=OpenApiTypes.OBJECT,
        responses={201: ModelSerializer, **WRITE_ERRORS},
    )
    def post(self, request):
        data = self.body(request)
        model = catalog_call(lambda: service.add_model(data, actor=self.actor(request)))
        answer = model_answer(model.name)
        warnings = getattr(model, "warnings", None)
        return Response(answer, status=201, headers={"X-Llmgw-Warning": " | ".join(warnings)} if warnings else None)


class ModelView(ApiView):
    @extend_schema(
        operation_id="remove_model",
        summary="Remove a model (by its name, not an alias)",
        responses={200: RemovedSerializer, **WRITE_ERRORS},
    )
    def delete(self, request, name: str):
        catalog_call(lambda: service.remove_model(name, actor=self.actor(request)))
        return Response({"removed": name})


class ScaleView(ApiView):
    @extend_schema(
        operation_id="scale_model",
        summary="Set how many replicas a model runs, and its idle timeout",
        request=ScaleRequestSerializer,
        responses={200: ScaleSerializer, **WRITE_ERRORS},
    )
    def post(self, request, name: str):
        body = self.body(request)
        low = _count(body, "min", required=True)
        high = _count(body, "max", required=False)
        kwargs: dict[str, Any] = {"min_replicas": low, "max_replicas": high}
        if "idle_timeout" in body:
            kwargs["idle_timeout"] = _idle_timeout(body["idle_timeout"])
        model = catalog_call(lambda: service.scale_model(name, actor=self.actor(request), **kwargs))
        answer = {
            "model": model.name,
            "min": model.min_replicas,
            "max": model.max_replicas,
            "on_demand": model.on_demand,
        }
        if model.idle_timeout is not None:
            answer["idle_timeout_seconds"] = int(model.idle_timeout.total_seconds())
        return Response(answer)


def _count(body: dict, key: str, *, required: bool) -> int | None:
    value = body.get(key)
    if value is None and not required:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise Refused(400, f"{key} must be a whole number of replicas, like 2 (got {value!r})")
    if not 0 <= value <= MAX_REPLICAS:
        raise Refused(400, f"{key} must be between 0 and {MAX_REPLICAS} (got {value})")
    return value


def _idle_timeout(value: Any) -> timedelta | None:
    if value is None:
        return None
    seconds = parse_duration(value)
    if seconds is None or seconds > timedelta.max.total_seconds() / 2:
        raise Refused(400, f"idle_timeout must be a duration like 30m, 1h30m or 90s, or null for never (got {value!r})")
    return timedelta(seconds=seconds)


class CapacityListView(ApiView):
    @extend_schema(
        operation_id="capacity",
        summary="Every stored capacity measurement",
        responses={200: CapacitySerializer(many=True), **ERRORS},
    )
    def get(self, request):
        return Response(capacity_list())


class CapacityView(ApiView):
    """Record what one replica of a model was measured to serve on one profile.

    A PUT: re-running a benchmark replaces what was known about that model on
    that profile — a better answer to the same question, not another point.
    The model must exist now (a measurement filed under a typo looks like a
    model never benchmarked), but the row outlives it: benchmarks cost GPU time.
    """

    @extend_schema(
        operation_id="put_capacity",
        summary="Store a capacity measurement for a model's profile",
        request=CapacityRequestSerializer,
        responses={200: CapacitySerializer, **WRITE_ERRORS},
    )
    def put(self, request, name: str):
        body = self.body(request)
        profile = body.get("profile")
        if not isinstance(profile, str) or not profile.strip():
            raise Refused(400, "a measurement needs the profile it was taken on: a model on CPU and on a GPU differ")
        measured_at = _when(body.get("measured_at"))
        model = service.resolve(name)
        if model is None:
            raise Refused(404, f"no model named {name!r} is in the catalog")
        if not model.profiles.filter(name=profile).exists():
            names = ", ".join(model.profiles.values_list("name", flat=True)) or "none"
            raise Refused(400, f"model {model.name!r} has no profile named {profile!r} (its profiles: {names})")
        measurement = {k: v for k, v in body.items() if k not in ("profile", "measured_at", "model")}
        with transaction.atomic():
            row, _ = CapacityMeasurement.objects.update_or_create(
                model_name=model.name,
                profile_name=profile,
                defaults={"measurement": measurement, "measured_at": measured_at, "measured_by": self.actor(request)},
            )
            self.audit(request, "put-capacity", f"{model.name}/{profile}", measurement=measurement)
        return Response(capacity_view(row))


def _when(value: Any) -> datetime:
    if value is None:
        return timezone.now()
    try:
        parsed = parse_datetime(value) if isinstance(value, str) else None
    except ValueError:
        parsed = None
    if parsed is None:
        raise Refused(400, f"measured_at must be a time like 2026-10-05T14:00:00Z (got {value!r})")
    # A time without a zone is taken as UTC, as the rest of the API writes them.
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


PREFETCH_NOTE = (
    "Each node's agent is told at its next heartbeat and fetches the weights without starting the model; "
    "progress shows here and in `llmgw ctl models`. Placement prefers nodes holding a model's weights."
)


class PrefetchView(ApiView):
    @extend_schema(
        operation_id="prefetch_model",
        summary="Pull a model's weights onto nodes without starting it (nodes named, a pool, or a count)",
        request=PrefetchRequestSerializer,
        responses={200: PrefetchAnswerSerializer, **WRITE_ERRORS},
    )
    def post(self, request, name: str):
        body = self.body(request)
        model = service.resolve(name)  # by name or alias, as the gateway takes it
        if model is None:
            raise Refused(404, f"no model named {name!r}; `llmgw ctl models` lists them")
        nodes, pool, count = body.get("nodes"), body.get("pool"), body.get("count")
        if nodes is not None and (not isinstance(nodes, list) or not all(isinstance(n, str) and n for n in nodes)):
            raise Refused(400, 'nodes must be a list of node names, like ["hgx-001"]')
        if pool is not None and (not isinstance(pool, str) or not pool):
            raise Refused(400, "pool must be a pool's name, like gold")
        if count is not None and (isinstance(count, bool) or not isinstance(count, int)):
            raise Refused(400, f"count must be a whole number of nodes, like 2 (got {count!r})")
        actor = self.actor(request)
        try:
            with transaction.atomic():
                chosen = prefetch.choose_nodes(model, pool=pool, nodes=nodes, count=count)
                if not chosen:
                    raise prefetch.PrefetchRefused(409, "every node asked for already holds these weights")
                rows = prefetch.request(model, chosen, actor)
                self.audit(request, "prefetch-weights", model.name, nodes=chosen, source=model.source)
        except prefetch.PrefetchRefused as exc:
            raise Refused(exc.status, exc.message) from None
        return Response({"model": model.name, "prefetch": [prefetch_view(r) for r in rows], "note": PREFETCH_NOTE})
