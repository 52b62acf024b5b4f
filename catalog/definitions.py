"""A model's definition as operators write it — in YAML, in JSON to the API — read and checked.

Pure: a dict in, a :class:`ModelSpec` and a list of problems out. Problems are
sentences an operator can act on, each naming the field at fault; an unknown
field is a problem too, because a misspelt ``profils:`` silently ignored is a
model that never runs.

    name: llama-70b
    description: general chat, long context
    source: hf://meta-llama/Llama-3.1-70B-Instruct
    aliases: [llama]
    fallbacks: [llama-8b]
    adapters:                                        # LoRA adapters, each a model name of its own
      - {name: llama-70b-sql, source: hf://acme/llama-70b-sql-lora}
    scaling: {min: 1, max: 4, idle_timeout: 30m}     # min 0 = on demand
    profiles:                                        # tried in order
      - {name: nvl, engine: vllm, gpu_class: gb200-185g, gpus: 4, nodes: 2, tp: 8, pp: 1}
      - {name: cpu, engine: llamacpp, gpu_class: cpu, memory_gb: 8, gpus: 0, nodes: 1, tp: 1, pp: 1}
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from catalog import rules

MODEL_FIELDS = {"name", "description", "source", "aliases", "fallbacks", "adapters", "scaling", "profiles"}
ADAPTER_FIELDS = {"name", "source"}
# The column's width (CatalogModel.source, Adapter.source): a longer source is refused with a sentence.
SOURCE_MAX = 500
SCALING_FIELDS = {"min", "max", "idle_timeout"}
# Past a year "idle for this long" means "never", which null says plainly; the bound also keeps
# 2**63 seconds or a YAML .inf from overflowing the duration column.
MAX_IDLE_TIMEOUT_S = 366 * 86400
PROFILE_FIELDS = {"name", "engine", "gpu_class", "memory_gb", "gpus", "nodes", "tp", "pp", "pool", "engine_args", "env"}
DURATION_RE = re.compile(r"^(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")
SOURCE_SCHEMES = ("hf://", "file://", "https://", "http://")


@dataclass(frozen=True)
class ProfileSpec:
    """One way to run a replica of a model: the one type for a profile's content, wherever it is read.

    The parser makes one from a definition, a stored row gives one
    (:meth:`catalog.models.Profile.spec`), and the scheduler places them.
    ``gpus`` is GPUs per node (per shard); ``nodes`` how many nodes one replica
    spans. ``gpu_class`` is a class like ``h100-80g``, a MIG class like
    ``a100-80g-mig-3g.40gb``, or ``cpu`` with ``memory_gb``. ``pool`` set (not
    blank) confines the profile to nodes labelled ``pool=<pool>``. ``env`` is
    the engine's environment as sorted (name, value) pairs.

    ``fingerprint`` is the catalog's hash of the definition as stored with the
    row, to tell replicas placed under an older definition; blank for a
    definition not stored yet. It is no part of the content: two specs that
    differ only in it are equal, and :meth:`definition` leaves it out.
    """

    name: str
    engine: str
    gpu_class: str
    gpus: int = 1
    nodes: int = 1
    tp: int = 1
    pp: int = 1
    memory_gb: float | None = None
    pool: str = ""
    engine_args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    fingerprint: str = field(default="", compare=False)

    def definition(self) -> dict[str, Any]:
        """What decides how the engine runs; the catalog's fingerprint is taken over this."""
        return {
            "engine": self.engine,
            "gpu_class": self.gpu_class,
            "memory_gb": self.memory_gb,
            "gpus": self.gpus,
            "nodes": self.nodes,
            "tp": self.tp,
            "pp": self.pp,
            "pool": self.pool,
            "engine_args": list(self.engine_args),
            "env": dict(self.env),
        }

    def problems(self) -> list[str]:
        """What is wrong with this profile's shape, in an operator's words (none: fine)."""
        return rules.profile_problems(
            engine=self.engine,
            gpu_class=self.gpu_class,
            gpus=self.gpus,
            nodes=self.nodes,
            tp=self.tp,
            pp=self.pp,
            memory_gb=self.memory_gb,
        )


@dataclass(frozen=True)
class AdapterSpec:
    """A LoRA adapter on a model: a model name clients may ask for, served by the base model's replicas."""

    name: str
    source: str


@dataclass(frozen=True)
class ModelSpec:
    """A checked definition. ``idle_timeout_s`` None means replicas are never scaled down for idleness."""

    name: str
    description: str = ""
    source: str = ""
    aliases: tuple[str, ...] = ()
    fallbacks: tuple[str, ...] = ()
    min_replicas: int = 1
    max_replicas: int = 1
    idle_timeout_s: float | None = None
    profiles: tuple[ProfileSpec, ...] = field(default_factory=tuple)
    adapters: tuple[AdapterSpec, ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        """Every name the definition claims for clients: its own, its aliases, its adapters'."""
        return (self.name, *self.aliases, *(a.name for a in self.adapters))


def parse_duration(value: Any) -> float | None:
    """``30m``, ``1h30m``, ``45s`` or a number of seconds; None when it is none of those."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value) if value >= 0 else None
    if not isinstance(value, str) or not value.strip():
        return None
    text = value.strip()
    if text.isdigit():
        return float(text)
    match = DURATION_RE.match(text)
    if not match or not any(match.groups()):
        return None
    hours, minutes, seconds = (int(g) if g else 0 for g in match.groups())
    return float(hours * 3600 + minutes * 60 + seconds)


def format_duration(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    text = (f"{hours}h" if hours else "") + (f"{minutes}m" if minutes else "") + (f"{secs}s" if secs else "")
    return text or "0s"


def _int(value: Any, where: str, problems: list[str], default: int, low: int = 0) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        problems.append(f"{where} must be a whole number, not {value!r}")
        return default
    if value < low:
        problems.append(f"{where} must be {low} or more, not {value}")
    return value


def _str(value: Any, where: str, problems: list[str]) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        problems.append(f"{where} must be text, not {value!r}")
        return ""
    return value.strip()


def _names(value: Any, where: str, problems: list[str]) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        problems.append(f"{where} must be a list of names")
        return ()
    names = tuple(v.strip() for v in value)
    for name in names:
        problem = rules.name_problem(where.rstrip("s"), name)
        if problem:
            problems.append(problem)
    if len(set(names)) != len(names):
        problems.append(f"{where} lists a name twice")
    return names


def source_problem(where: str, source: str) -> str | None:
    """Why ``source`` is no place weights (or an adapter) can be fetched from; None when it is one."""
    if not source.startswith(SOURCE_SCHEMES):
        return f"{where} {source!r} must start with one of {', '.join(SOURCE_SCHEMES)}"
    if len(source) > SOURCE_MAX:
        return f"{where} is {len(source)} characters long; at most {SOURCE_MAX} are kept"
    return None


def _adapters(value: Any, problems: list[str]) -> tuple[AdapterSpec, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        problems.append("adapters must be a list of {name, source} mappings")
        return ()
    out: list[AdapterSpec] = []
    for i, data in enumerate(value):
        where = f"adapters[{i}]"
        if not isinstance(data, dict):
            problems.append(f"{where} must be a mapping with name and source")
            continue
        _unknown(data, ADAPTER_FIELDS, where, problems)
        name = _str(data.get("name"), f"{where}.name", problems)
        problem = rules.name_problem("adapter name", name)
        if problem:
            problems.append(f"{where}: {problem}")
        source = _str(data.get("source"), f"{where}.source", problems)
        if not source:
            problems.append(f"{where}.source is missing: say where the adapter's weights are (hf://…, file:///…)")
        elif problem := source_problem(f"{where}.source", source):
            problems.append(problem)
        out.append(AdapterSpec(name=name, source=source))
    names = [a.name for a in out]
    for dup in sorted({n for n in names if n and names.count(n) > 1}):
        problems.append(f"adapter name {dup!r} is used twice")
    return tuple(out)


def _unknown(data: dict, allowed: set[str], where: str, problems: list[str]) -> None:
    for key in sorted(set(data) - allowed, key=str):
        problems.append(f"{where}: unknown field {key!r} (known: {', '.join(sorted(allowed))})")


def _scaling(data: Any, problems: list[str]) -> tuple[int, int, float | None]:
    if data is None:
        return 1, 1, None
    if not isinstance(data, dict):
        problems.append("scaling must be a mapping like {min: 1, max: 4, idle_timeout: 30m}")
        return 1, 1, None
    _unknown(data, SCALING_FIELDS, "scaling", problems)
    low = _int(data.get("min"), "scaling.min", problems, 1)
    # A max left out follows min; a model that is started on demand needs room for one.
    high = _int(data.get("max"), "scaling.max", problems, max(low, 1))
    problems += rules.scaling_problems(low, high)
    idle = None
    if data.get("idle_timeout") is not None:
        idle = parse_duration(data["idle_timeout"])
        if idle is None:
            problems.append(f"scaling.idle_timeout {data['idle_timeout']!r} is not a duration like 30m, 2h or 90s")
        elif not idle <= MAX_IDLE_TIMEOUT_S:  # also catches a YAML .inf
            problems.append(
                f"scaling.idle_timeout {data['idle_timeout']!r} is longer than a year; use null to never scale down"
            )
            idle = None
    return low, high, idle


def _profile(data: Any, i: int, problems: list[str]) -> ProfileSpec | None:
    where = f"profiles[{i}]"
    if not isinstance(data, dict):
        problems.append(f"{where} must be a mapping with engine and gpu_class")
        return None
    _unknown(data, PROFILE_FIELDS, where, problems)
    name = _str(data.get("name"), f"{where}.name", problems) or f"p{i}"
    problem = rules.name_problem("profile name", name)
    if problem:
        problems.append(f"{where}: {problem}")
    engine = _str(data.get("engine"), f"{where}.engine", problems)
    gpu_class = _str(data.get("gpu_class"), f"{where}.gpu_class", problems).lower()
    cpu = gpu_class == rules.CPU_CLASS
    gpus = _int(data.get("gpus"), f"{where}.gpus", problems, 0 if cpu else 1)
    nodes = _int(data.get("nodes"), f"{where}.nodes", problems, 1, low=1)
    tp = _int(data.get("tp"), f"{where}.tp", problems, 1, low=1)
    pp = _int(data.get("pp"), f"{where}.pp", problems, 1, low=1)
    memory = data.get("memory_gb")
    if memory is not None and (isinstance(memory, bool) or not isinstance(memory, int | float) or memory <= 0):
        problems.append(f"{where}.memory_gb must be a positive number of gigabytes")
        memory = None
    args = data.get("engine_args") or []
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        problems.append(f"{where}.engine_args must be a list of strings")
        args = []
    env = data.get("env") or {}
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        problems.append(f"{where}.env must map names to string values (quote numbers)")
        env = {}
    problems += rules.launch_problems(engine, args, env, f"{where}.")
    spec = ProfileSpec(
        name=name,
        engine=engine,
        gpu_class=gpu_class,
        gpus=gpus,
        nodes=nodes,
        tp=tp,
        pp=pp,
        memory_gb=float(memory) if memory is not None else None,
        pool=_str(data.get("pool"), f"{where}.pool", problems),
        engine_args=tuple(args),
        env=tuple(sorted(env.items())),
    )
    problems += [f"profile {name}: {p}" for p in spec.problems()]
    return spec


def parse_definition(data: Any) -> tuple[ModelSpec | None, list[str]]:
    """Read a definition; the spec is None whenever there is any problem."""
    if not isinstance(data, dict):
        return None, ["a model definition must be a mapping with at least name and profiles"]
    problems: list[str] = []
    _unknown(data, MODEL_FIELDS, "model", problems)
    name = _str(data.get("name"), "name", problems)
    problem = rules.name_problem("model name", name)
    if problem:
        problems.append(problem)
    source = _str(data.get("source"), "source", problems)
    if source and (problem := source_problem("source", source)):
        problems.append(problem)
    aliases = _names(data.get("aliases"), "aliases", problems)
    if name and name in aliases:
        problems.append(f"alias {name!r} is the model's own name")
    adapters = _adapters(data.get("adapters"), problems)
    for adapter in adapters:
        if adapter.name and adapter.name in (name, *aliases):
            what = "the model's own name" if adapter.name == name else "one of the model's aliases"
            problems.append(f"adapter {adapter.name!r} is {what}")
    fallbacks = _names(data.get("fallbacks"), "fallbacks", problems)
    if name and name in fallbacks:
        problems.append("a model cannot fall back to itself")
    low, high, idle = _scaling(data.get("scaling"), problems)
    raw_profiles = data.get("profiles")
    profiles: list[ProfileSpec] = []
    if not isinstance(raw_profiles, list) or not raw_profiles:
        problems.append("profiles must list at least one way to run the model")
    else:
        for i, raw in enumerate(raw_profiles):
            spec = _profile(raw, i, problems)
            if spec:
                profiles.append(spec)
        names = [p.name for p in profiles]
        for dup in sorted({n for n in names if names.count(n) > 1}):
            problems.append(f"profile name {dup!r} is used twice")
    if problems:
        return None, problems
    return ModelSpec(
        name=name,
        description=_str(data.get("description"), "description", problems),
        source=source,
        aliases=aliases,
        fallbacks=fallbacks,
        min_replicas=low,
        max_replicas=high,
        idle_timeout_s=idle,
        profiles=tuple(profiles),
        adapters=adapters,
    ), []


def spec_to_definition(spec: ModelSpec) -> dict:
    """The spec back in the shape operators write."""
    out: dict[str, Any] = {"name": spec.name}
    if spec.description:
        out["description"] = spec.description
    if spec.source:
        out["source"] = spec.source
    if spec.aliases:
        out["aliases"] = list(spec.aliases)
    if spec.fallbacks:
        out["fallbacks"] = list(spec.fallbacks)
    if spec.adapters:
        # By name, as the store reads them back, so an unchanged file is seen to be unchanged.
        out["adapters"] = [{"name": a.name, "source": a.source} for a in sorted(spec.adapters, key=lambda a: a.name)]
    scaling: dict[str, Any] = {"min": spec.min_replicas, "max": spec.max_replicas}
    if spec.idle_timeout_s is not None:
        scaling["idle_timeout"] = format_duration(spec.idle_timeout_s)
    out["scaling"] = scaling
    out["profiles"] = [profile_definition(p) for p in spec.profiles]
    return out


def profile_definition(p: ProfileSpec) -> dict:
    """One profile in the shape operators write it; a field at its default-empty value is left out."""
    out: dict[str, Any] = {
        "name": p.name,
        "engine": p.engine,
        "gpu_class": p.gpu_class,
        "gpus": p.gpus,
        "nodes": p.nodes,
        "tp": p.tp,
        "pp": p.pp,
    }
    if p.memory_gb is not None:
        out["memory_gb"] = p.memory_gb
    if p.pool:
        out["pool"] = p.pool
    if p.engine_args:
        out["engine_args"] = list(p.engine_args)
    if p.env:
        out["env"] = dict(p.env)
    return out
