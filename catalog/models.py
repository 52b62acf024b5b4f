"""The catalog: models, their profiles, aliases, fallbacks, and measured capacity."""

from __future__ import annotations

from datetime import timedelta

from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import F, Q
from django.utils import timezone

from catalog import definitions, rules
from catalog.definitions import ProfileSpec


class Engine(models.TextChoices):
    VLLM = "vllm", "vLLM"
    LLAMACPP = "llamacpp", "llama.cpp"
    SGLANG = "sglang", "SGLang"


class DeclaredIn(models.TextChoices):
    STORE = "store", "the store (admin or API)"
    FILE = "file", "the configuration file"


class CatalogModel(models.Model):
    """A model operators want served, under one name and any number of aliases.

    A model declared in the configuration file (``declared_in = file``) is
    rewritten from that file and is read-only in the admin and the API.
    """

    name = models.CharField(max_length=128, unique=True)
    description = models.TextField(blank=True)
    source = models.CharField(
        max_length=500, blank=True, help_text="Where the weights come from: hf://…, file:///…, https://…"
    )
    min_replicas = models.PositiveIntegerField(default=1, help_text="0 means started on demand.")
    max_replicas = models.PositiveIntegerField(default=1)
    idle_timeout = models.DurationField(
        null=True, blank=True, help_text="Scale an unused replica down to the minimum after this; empty: never."
    )
    declared_in = models.CharField(max_length=8, choices=DeclaredIn.choices, default=DeclaredIn.STORE)
    failure_streak = models.PositiveIntegerField(
        default=0, editable=False, help_text="Replica starts that failed in a row; reset by one that is ready."
    )
    parked_at = models.DateTimeField(
        null=True, blank=True, help_text="Set when starts failed too often in a row; scaling or unparking clears it."
    )
    parked_error = models.TextField(blank=True, help_text="The last error before the model was parked.")

    created_at = models.DateTimeField(default=timezone.now, editable=False)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = "model"
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(condition=Q(max_replicas__gte=F("min_replicas")), name="model_max_ge_min"),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def read_only(self) -> bool:
        return self.declared_in == DeclaredIn.FILE

    @property
    def on_demand(self) -> bool:
        return self.min_replicas == 0

    def clean(self) -> None:
        problems = [p for p in [rules.name_problem("model name", self.name)] if p]
        problems += rules.scaling_problems(self.min_replicas or 0, self.max_replicas or 0)
        if self.idle_timeout is not None and self.idle_timeout < timedelta(0):
            problems.append("the idle timeout cannot be negative")
        if self.name and Alias.objects.filter(name=self.name).exclude(model_id=self.pk).exists():
            problems.append(f"{self.name!r} is already another model's alias")
        if self.name and Adapter.objects.filter(name=self.name).exists():
            problems.append(f"{self.name!r} is already the name of an adapter")
        if problems:
            raise ValidationError(problems)


class Alias(models.Model):
    """Another name clients may use for a model; unique across every model."""

    model = models.ForeignKey(CatalogModel, on_delete=models.CASCADE, related_name="aliases")
    name = models.CharField(max_length=128, unique=True)

    class Meta:
        verbose_name_plural = "aliases"
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        problem = rules.name_problem("alias", self.name)
        if problem:
            raise ValidationError({"name": problem})
        if CatalogModel.objects.filter(name=self.name).exclude(pk=self.model_id).exists():
            raise ValidationError({"name": f"{self.name!r} is the name of another model"})
        owner = Alias.objects.filter(name=self.name).exclude(pk=self.pk).select_related("model").first()
        if owner:
            raise ValidationError({"name": f"alias {self.name!r} already belongs to model {owner.model.name}"})
        if Adapter.objects.filter(name=self.name).exists():
            raise ValidationError({"name": f"{self.name!r} is the name of an adapter"})


class Adapter(models.Model):
    """A LoRA adapter on a base model: a model name of its own that clients ask for.

    It is served by the base model's replicas, which load it beside the base
    weights; keys allow it, and prices and budgets count it, under its own
    name. Its name is unique across every model, alias and adapter.
    """

    model = models.ForeignKey(CatalogModel, on_delete=models.CASCADE, related_name="adapters")
    name = models.CharField(max_length=128, unique=True)
    source = models.CharField(max_length=500, help_text="Where the adapter's weights come from: hf://…, file:///…")

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        problems = [p for p in [rules.name_problem("adapter name", self.name)] if p]
        source_problem = definitions.source_problem("source", self.source or "")
        if source_problem:
            problems.append(source_problem)
        if self.name and CatalogModel.objects.filter(name=self.name).exists():
            problems.append(f"{self.name!r} is the name of a model")
        if self.name and Alias.objects.filter(name=self.name).exists():
            problems.append(f"{self.name!r} is already an alias")
        if self.name and Adapter.objects.filter(name=self.name).exclude(pk=self.pk).exists():
            problems.append(f"adapter {self.name!r} already exists")
        if problems:
            raise ValidationError(problems)


class Fallback(models.Model):
    """Where a model's requests go, in order, when it has no ready replica."""

    model = models.ForeignKey(CatalogModel, on_delete=models.CASCADE, related_name="fallbacks")
    target = models.ForeignKey(CatalogModel, on_delete=models.CASCADE, related_name="fallback_for")
    position = models.PositiveSmallIntegerField(default=0)

    class Meta:
        ordering = ["model", "position"]
        constraints = [
            models.UniqueConstraint(fields=["model", "target"], name="fallback_unique_target"),
            models.UniqueConstraint(fields=["model", "position"], name="fallback_unique_position"),
            models.CheckConstraint(condition=~Q(model=F("target")), name="fallback_not_self"),
        ]

    def __str__(self) -> str:
        return f"{self.model} → {self.target}"

    def clean(self) -> None:
        if self.model_id and self.target_id:
            if self.model_id == self.target_id:
                raise ValidationError({"target": "a model cannot fall back to itself"})
            graph: dict[str, list[str]] = {}
            for fb in Fallback.objects.exclude(pk=self.pk).select_related("model", "target"):
                graph.setdefault(fb.model.name, []).append(fb.target.name)
            graph.setdefault(self.model.name, []).append(self.target.name)
            loop = rules.fallback_cycle(self.model.name, graph)
            if loop:
                raise ValidationError({"target": "these fallbacks loop back: " + " → ".join(loop)})


class Profile(models.Model):
    """One way to run a replica of a model. Profiles are tried in ``position`` order."""

    model = models.ForeignKey(CatalogModel, on_delete=models.CASCADE, related_name="profiles")
    name = models.CharField(max_length=64)
    position = models.PositiveSmallIntegerField(default=0)
    engine = models.CharField(max_length=16, choices=Engine.choices)
    gpu_class = models.CharField("GPU class", max_length=100, help_text="e.g. h100-80g, a100-80g-mig-3g.40gb, or cpu.")
    memory_gb = models.FloatField(null=True, blank=True, help_text="For CPU profiles: memory one replica needs.")
    gpus = models.PositiveSmallIntegerField("GPUs per node", default=1)
    nodes = models.PositiveSmallIntegerField(default=1)
    tp = models.PositiveSmallIntegerField("tensor parallel", default=1)
    pp = models.PositiveSmallIntegerField("pipeline parallel", default=1)
    pool = models.CharField(max_length=100, blank=True, help_text="Confine to nodes labelled pool=<this>.")
    engine_args = models.JSONField(default=list, blank=True)
    env = models.JSONField("environment", default=dict, blank=True)
    fingerprint = models.CharField(max_length=16, editable=False)

    class Meta:
        ordering = ["model", "position", "name"]
        constraints = [
            models.UniqueConstraint(fields=["model", "name"], name="profile_unique_name"),
            models.CheckConstraint(condition=Q(nodes__gte=1), name="profile_nodes_ge_1"),
            models.CheckConstraint(condition=Q(tp__gte=1) & Q(pp__gte=1), name="profile_parallel_ge_1"),
            models.CheckConstraint(
                condition=Q(memory_gb__isnull=True) | Q(memory_gb__gt=0), name="profile_memory_positive"
            ),
            models.CheckConstraint(condition=Q(engine__in=Engine.values), name="profile_engine_known"),
        ]

    def __str__(self) -> str:
        return f"{self.model.name}/{self.name}" if self.model_id else self.name

    def save(self, *args, **kwargs) -> None:
        self.fingerprint = rules.fingerprint(self.definition())
        super().save(*args, **kwargs)

    def spec(self) -> ProfileSpec:
        """This profile as the one spec type that definitions, the API and the scheduler all read.

        The one place a row's fields are copied out. A form's blank number is
        None until Django refuses it, and reads as 0 here so :meth:`clean`
        still lists every problem; engine arguments that are not a list, or an
        environment that is not a mapping, read as none (``clean`` refuses them).
        """
        args = self.engine_args if isinstance(self.engine_args, list) else []
        env = self.env if isinstance(self.env, dict) else {}
        return ProfileSpec(
            name=self.name,
            engine=self.engine,
            gpu_class=self.gpu_class,
            gpus=self.gpus or 0,
            nodes=self.nodes or 0,
            tp=self.tp or 0,
            pp=self.pp or 0,
            memory_gb=self.memory_gb,
            pool=self.pool,
            engine_args=tuple(args),
            env=tuple(sorted((str(k), str(v)) for k, v in env.items())),
            fingerprint=self.fingerprint,
        )

    def take(self, spec: ProfileSpec) -> None:
        """Make the row hold the spec's content, the inverse of :meth:`spec`; saving takes the fingerprint again."""
        self.name = spec.name
        self.engine, self.gpu_class, self.memory_gb = spec.engine, spec.gpu_class, spec.memory_gb
        self.gpus, self.nodes, self.tp, self.pp, self.pool = spec.gpus, spec.nodes, spec.tp, spec.pp, spec.pool
        self.engine_args, self.env = list(spec.engine_args), dict(spec.env)

    def definition(self) -> dict:
        """What decides how the engine runs; the fingerprint is taken over this."""
        return self.spec().definition()

    def clean(self) -> None:
        problems = [p for p in [rules.name_problem("profile name", self.name)] if p]
        problems += self.spec().problems()
        if not isinstance(self.engine_args, list) or not all(isinstance(a, str) for a in self.engine_args):
            problems.append("engine arguments must be a list of strings")
        if not isinstance(self.env, dict) or not all(isinstance(v, str) for v in self.env.values()):
            problems.append("the environment must map names to string values")
        else:
            args = self.engine_args if isinstance(self.engine_args, list) else []
            problems += rules.launch_problems(self.engine, [a for a in args if isinstance(a, str)], self.env)
        if problems:
            raise ValidationError(problems)


class CapacityMeasurement(models.Model):
    """What one replica of a model was measured to serve on one profile.

    Kept by name rather than by foreign key: a benchmark costs real GPU time,
    and it should outlive the catalog entry being removed and added again.
    """

    model_name = models.CharField(max_length=128)
    profile_name = models.CharField(max_length=64)
    measurement = models.JSONField()
    measured_at = models.DateTimeField(default=timezone.now)
    measured_by = models.CharField(max_length=200, blank=True)

    class Meta:
        ordering = ["model_name", "profile_name"]
        constraints = [
            models.UniqueConstraint(fields=["model_name", "profile_name"], name="capacity_unique_profile"),
        ]

    def __str__(self) -> str:
        return f"{self.model_name}/{self.profile_name}"


class CatalogFile(models.Model):
    """The configuration file's last pass: which bytes were read and what was wrong with them.

    Keeps the digest so every worker (and a restarted one) agrees on whether
    the file changed; ``problems`` are shown to operators, since a refused
    definition in a file nobody is watching is otherwise silent.
    """

    path = models.CharField(max_length=500, unique=True)
    digest = models.CharField(max_length=64, blank=True)
    loaded_at = models.DateTimeField(null=True, blank=True)
    problems = models.JSONField(default=list, blank=True)

    def __str__(self) -> str:
        return self.path


class WeightCollection(models.Model):
    """Orphaned weights an operator asked to have deleted from a node's disk.

    One row per node and path. The agent is told at its heartbeat and reports
    back (``done_at``, or ``error``); until then the row is pending, and
    asking again does not add a second one. Recorded by node name rather than
    by foreign key so the request survives the node re-registering.
    """

    node = models.CharField(max_length=200, db_index=True)
    path = models.CharField(max_length=1000)
    name = models.CharField(max_length=500, blank=True)
    bytes = models.BigIntegerField(null=True, blank=True, help_text="NULL: the agent did not report the size.")
    requested_at = models.DateTimeField(default=timezone.now, db_index=True)
    requested_by = models.CharField(max_length=200)
    done_at = models.DateTimeField(null=True, blank=True)
    error = models.TextField(blank=True)

    class Meta:
        # The table the REST app created, kept when the model moved here (catalog 0004, api 0002): no rows copied.
        db_table = "api_weightcollection"
        ordering = ["-requested_at", "node", "path"]
        constraints = [
            models.UniqueConstraint(
                fields=["node", "path"], condition=Q(done_at__isnull=True), name="weightcollection_one_pending"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.node}:{self.path}"

    @property
    def pending(self) -> bool:
        return self.done_at is None


class WeightPrefetch(models.Model):
    """A model's weights an operator asked to have pulled onto a node's disk, without starting it.

    One row per model and node; asking again starts it over. The agent is
    told at its heartbeat, fetches with the code a shard's start uses, and
    reports progress with each beat (``bytes_done``, ``bytes_total`` when the
    source says), then ``done_at`` with the ``path`` the weights landed at,
    or ``error``. While the model exists its prefetched copies are no
    orphans (``catalog.reads.orphan_weights``); the row goes with the model.
    """

    model = models.ForeignKey(CatalogModel, on_delete=models.CASCADE, related_name="prefetches")
    node = models.CharField(max_length=200, db_index=True)
    source = models.CharField(max_length=500, help_text="The model's source when asked for.")
    requested_at = models.DateTimeField(default=timezone.now)
    requested_by = models.CharField(max_length=200)
    updated_at = models.DateTimeField(null=True, blank=True, help_text="The agent's latest word on it.")
    bytes_done = models.BigIntegerField(null=True, blank=True)
    bytes_total = models.BigIntegerField(null=True, blank=True, help_text="NULL: the source did not say.")
    path = models.CharField(max_length=1000, blank=True, help_text="Where the weights are on the node, once done.")
    done_at = models.DateTimeField(null=True, blank=True)
    error = models.TextField(blank=True)

    class Meta:
        ordering = ["model__name", "node"]
        constraints = [models.UniqueConstraint(fields=["model", "node"], name="weightprefetch_one_per_node")]

    def __str__(self) -> str:
        return f"{self.model.name}@{self.node}"

    @property
    def state(self) -> str:
        """requested (the agent has not said), fetching, done or failed."""
        if self.done_at is not None:
            return "failed" if self.error else "done"
        return "requested" if self.updated_at is None else "fetching"
