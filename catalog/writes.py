"""Changing the catalog: the one path the API, ``ctl``, the admin's actions and the YAML loader share.

Each function checks what only the database can tell (names taken, fallbacks
that exist or loop), makes the change in one transaction, writes the audit
log, and says that something changed (placement listens, and reconciles soon).
Refusals are :class:`CatalogError` with the HTTP status that fits and a
sentence that says what to fix.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db import transaction

from catalog import rules, signals
from catalog.definitions import AdapterSpec, ModelSpec, parse_definition, spec_to_definition
from catalog.models import Adapter, Alias, CatalogModel, DeclaredIn, Fallback, Profile
from core.models import AuditEntry
from inventory.models import GPU


class Unset:
    """Marks an argument that was not given, where None means something."""


UNSET = Unset()


class CatalogError(Exception):
    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


def _notify(model_name: str) -> None:
    """Say the model changed once the change is committed (placement listens, and reconciles soon)."""
    transaction.on_commit(lambda: signals.model_changed.send(sender=CatalogModel, name=model_name))


def _audit(actor: str, action: str, target: str, **detail: Any) -> None:
    AuditEntry.record(actor, action, target, detail)


def resolve(name_or_alias: str) -> CatalogModel | None:
    """The model called this, by its name or one of its aliases."""
    model = CatalogModel.objects.filter(name=name_or_alias).first()
    if model is None:
        alias = Alias.objects.select_related("model").filter(name=name_or_alias).first()
        model = alias.model if alias else None
    return model


def _get(name: str) -> CatalogModel:
    model = resolve(name)
    if model is None:
        raise CatalogError(f"no model named {name!r} is in the catalog", 404)
    return model


def _writable(model: CatalogModel) -> None:
    if model.read_only:
        raise CatalogError(f"model {model.name!r} is declared in the configuration file; change it there", 409)


def _parse(data: Any) -> ModelSpec:
    spec, problems = parse_definition(data)
    if spec is None:
        raise CatalogError("the definition was not accepted: " + "; ".join(problems), 400)
    return spec


def _check_names(spec: ModelSpec, existing: CatalogModel | None) -> None:
    """Names the definition claims must not belong to another model, as a name, an alias or an adapter."""
    own = existing.pk if existing else None
    adapters = {a.name for a in spec.adapters}
    for claimed in spec.names:
        what = "model name" if claimed == spec.name else "adapter" if claimed in adapters else "alias"
        other = CatalogModel.objects.filter(name=claimed).exclude(pk=own).first()
        if other is not None:
            raise CatalogError(f"{what} {claimed!r} is already the name of another model", 409)
        alias = Alias.objects.select_related("model").filter(name=claimed).exclude(model_id=own).first()
        if alias is not None:
            raise CatalogError(f"{what} {claimed!r} is already an alias of model {alias.model.name}", 409)
        adapter = Adapter.objects.select_related("model").filter(name=claimed).exclude(model_id=own).first()
        if adapter is not None:
            raise CatalogError(f"{what} {claimed!r} is already an adapter of model {adapter.model.name}", 409)


def _check_fallbacks(spec: ModelSpec) -> list[CatalogModel]:
    targets = []
    for name in spec.fallbacks:
        target = resolve(name)
        if target is None:
            raise CatalogError(f"fallback {name!r} is not in the catalog; add it first", 400)
        if target.name == spec.name:
            raise CatalogError("a model cannot fall back to itself", 400)
        targets.append(target)
    graph: dict[str, list[str]] = {}
    for fb in Fallback.objects.select_related("model", "target").exclude(model__name=spec.name):
        graph.setdefault(fb.model.name, []).append(fb.target.name)
    graph[spec.name] = [t.name for t in targets]
    loop = rules.fallback_cycle(spec.name, graph)
    if loop:
        raise CatalogError("these fallbacks loop back: " + " → ".join(loop), 400)
    return targets


def class_warnings(spec: ModelSpec) -> list[str]:
    """GPU classes no node has ever reported: a warning, not a refusal — the hardware may be on its way."""
    wanted = {p.gpu_class for p in spec.profiles if p.gpu_class != rules.CPU_CLASS}
    known = set(GPU.objects.filter(gpu_class__in=wanted).values_list("gpu_class", flat=True).distinct())
    return [f"no node has reported a {c} GPU yet; profiles using it wait for one" for c in sorted(wanted - known)]


def _write(model: CatalogModel, spec: ModelSpec, targets: list[CatalogModel]) -> None:
    """Make the rows match the spec, keeping profiles by name so their replicas can be judged stale."""
    kept = {p.name: p for p in model.profiles.all()}
    for position, p in enumerate(spec.profiles):
        profile = kept.pop(p.name, None) or Profile(model=model, name=p.name)
        profile.position = position
        profile.take(p)
        profile.save()
    Profile.objects.filter(pk__in=[p.pk for p in kept.values()]).delete()
    Alias.objects.filter(model=model).exclude(name__in=spec.aliases).delete()
    for name in spec.aliases:
        Alias.objects.get_or_create(model=model, name=name)
    # Kept by name, so an adapter's price (gateway.Price) outlives a change of its source.
    Adapter.objects.filter(model=model).exclude(name__in=[a.name for a in spec.adapters]).delete()
    for a in spec.adapters:
        Adapter.objects.update_or_create(model=model, name=a.name, defaults={"source": a.source})
    Fallback.objects.filter(model=model).delete()
    Fallback.objects.bulk_create(Fallback(model=model, target=t, position=i) for i, t in enumerate(targets))


def _apply_spec(model: CatalogModel, spec: ModelSpec) -> None:
    model.name, model.description, model.source = spec.name, spec.description, spec.source
    model.min_replicas, model.max_replicas = spec.min_replicas, spec.max_replicas
    model.idle_timeout = timedelta(seconds=spec.idle_timeout_s) if spec.idle_timeout_s is not None else None


@transaction.atomic
def add_model(data: Any, *, actor: str, declared_in: str = DeclaredIn.STORE) -> CatalogModel:
    """Add a model from its definition; ``model.warnings`` lists what deserves a look but is not wrong."""
    spec = _parse(data)
    if CatalogModel.objects.filter(name=spec.name).exists():
        raise CatalogError(f"a model named {spec.name!r} already exists; remove it first or scale it", 409)
    _check_names(spec, None)
    targets = _check_fallbacks(spec)
    model = CatalogModel(declared_in=declared_in)
    _apply_spec(model, spec)
    model.save()
    _write(model, spec, targets)
    _audit(actor, "add-model", spec.name, definition=spec_to_definition(spec))
    _notify(spec.name)
    model.warnings = class_warnings(spec)
    return model


@transaction.atomic
def upsert_model(data: Any, *, actor: str, declared_in: str) -> tuple[CatalogModel, bool]:
    """Create or redefine a model in place (the YAML loader's path); returns (model, changed).

    Redefining keeps the model's replicas: a profile whose definition changed
    gets a new fingerprint, and replicas placed under the old one are then
    reported stale rather than restarted.
    """
    spec = _parse(data)
    model = CatalogModel.objects.filter(name=spec.name).first()
    if model is None:
        return add_model(data, actor=actor, declared_in=declared_in), True
    if model.declared_in != declared_in:
        raise CatalogError(f"model {spec.name!r} already exists in {model.get_declared_in_display()}", 409)
    if model_definition(model) == spec_to_definition(spec):
        return model, False
    _check_names(spec, model)
    targets = _check_fallbacks(spec)
    _apply_spec(model, spec)
    model.save()
    _write(model, spec, targets)
    _audit(actor, "redefine-model", spec.name, definition=spec_to_definition(spec))
    _notify(spec.name)
    return model, True


@transaction.atomic
def remove_model(name: str, *, actor: str, allow_file: bool = False) -> None:
    # Its row locked before its replicas are read for the cascade: a reconciling pass that has just placed
    # a replica for it holds the row until its commit, and the deletion then finds that replica too (read
    # first, it would delete the others and fail at its commit on the new one).
    model = CatalogModel.objects.select_for_update(of=("self",)).filter(name=name).first()
    if model is None:
        raise CatalogError(f"no model named {name!r} is in the catalog (remove it by its name, not an alias)", 404)
    if not allow_file:
        _writable(model)
    if Fallback.objects.filter(target=model).exclude(model=model).exists():
        users = sorted(Fallback.objects.filter(target=model).values_list("model__name", flat=True))
        raise CatalogError(f"{name!r} is a fallback of {', '.join(users)}; change those first", 409)
    model.delete()
    _audit(actor, "remove-model", name)
    _notify(name)


@transaction.atomic
def scale_model(
    name: str,
    *,
    min_replicas: int,
    max_replicas: int | None = None,
    idle_timeout: timedelta | Unset | None = UNSET,
    actor: str,
) -> CatalogModel:
    """Set the replica range (and idle timeout); scaling also unparks, since an operator has acted."""
    model = _get(name)
    _writable(model)
    if max_replicas is None:
        max_replicas = max(min_replicas, 1)
    problems = rules.scaling_problems(min_replicas, max_replicas)
    if problems:
        raise CatalogError("; ".join(problems), 400)
    model.min_replicas, model.max_replicas = min_replicas, max_replicas
    if not isinstance(idle_timeout, Unset):
        if idle_timeout is not None and idle_timeout < timedelta(0):
            raise CatalogError("the idle timeout cannot be negative", 400)
        model.idle_timeout = idle_timeout
    model.parked_at, model.parked_error, model.failure_streak = None, "", 0
    model.save()
    _audit(
        actor,
        "scale",
        model.name,
        min=min_replicas,
        max=max_replicas,
        idle_timeout=model.idle_timeout.total_seconds() if model.idle_timeout else None,
    )
    _notify(model.name)
    return model


@transaction.atomic
def model_definition(model: CatalogModel) -> dict:
    """The model in the shape operators write (YAML / the API's POST body)."""
    spec = ModelSpec(
        name=model.name,
        description=model.description,
        source=model.source,
        aliases=tuple(model.aliases.order_by("name").values_list("name", flat=True)),
        fallbacks=tuple(model.fallbacks.order_by("position").values_list("target__name", flat=True)),
        min_replicas=model.min_replicas,
        max_replicas=model.max_replicas,
        idle_timeout_s=model.idle_timeout.total_seconds() if model.idle_timeout else None,
        profiles=tuple(p.spec() for p in model.profiles.order_by("position", "name")),
        adapters=tuple(AdapterSpec(a.name, a.source) for a in model.adapters.order_by("name")),
    )
    # Aliases are compared as written, in the spec's order.
    return spec_to_definition(spec)
