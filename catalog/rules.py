"""Rules a model definition must keep, free of Django so every path shares them.

The admin form, the API and the YAML loader all call these; each returns the
problems in an operator's words (an empty list means fine) rather than
raising, so a form can show every problem at once.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping

# What a profile may hand its engine (engine_args, env) is one rule that the agent applies again before
# it starts an engine, so it lives where the agent may import it; the catalog's callers reach it here.
from agent.launch_rules import launch_problems as launch_problems

ENGINES = {"vllm": "vLLM", "llamacpp": "llama.cpp", "sglang": "SGLang"}
CPU_CLASS = "cpu"
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")


def is_mig_class(gpu_class: str) -> bool:
    """``a100-80g-mig-3g.40gb`` is one MIG instance; ``a100-80g`` a whole card."""
    return "-mig-" in gpu_class


def name_problem(kind: str, name: str) -> str | None:
    if not NAME_RE.match(name or ""):
        return (
            f"{kind} {name!r} must start with a letter or digit and use only letters, digits, "
            "'.', '_', ':' and '-' (at most 128 characters)"
        )
    return None


def profile_problems(
    *, engine: str, gpu_class: str, gpus: int, nodes: int, tp: int, pp: int, memory_gb: float | None
) -> list[str]:
    """What is wrong with one profile's shape."""
    problems: list[str] = []
    if engine not in ENGINES:
        problems.append(f"engine {engine!r} is not one llmgw can run; use one of {', '.join(ENGINES)}")
    if not gpu_class:
        problems.append("a profile needs a GPU class, or 'cpu'")
        return problems
    if gpu_class == CPU_CLASS:
        if gpus:
            problems.append("a CPU profile uses no GPUs: set gpus to 0")
        if not memory_gb or memory_gb <= 0:
            problems.append("a CPU profile needs memory_gb: the memory one replica needs on its node")
        if nodes != 1 or tp != 1 or pp != 1:
            problems.append("a CPU profile runs on one node with tp 1 and pp 1")
        return problems
    if is_mig_class(gpu_class):
        # One process opens one MIG device, and instances have no NVLink
        # between them, so nothing can be split across two of them.
        if gpus != 1 or nodes != 1 or tp != 1 or pp != 1:
            problems.append(
                f"{gpu_class} is a MIG instance: a replica runs on exactly one, so gpus, nodes, tp and pp must all be 1"
            )
        return problems
    if gpus < 1:
        problems.append("a GPU profile needs at least one GPU per node")
    if nodes < 1:
        problems.append("a profile needs at least one node")
    if tp < 1 or pp < 1:
        problems.append("tp and pp must be at least 1")
    if gpus >= 1 and nodes >= 1 and tp >= 1 and pp >= 1 and tp * pp != gpus * nodes:
        problems.append(
            f"tp × pp ({tp} × {pp} = {tp * pp}) must equal gpus × nodes ({gpus} × {nodes} = {gpus * nodes})"
        )
    return problems


def scaling_problems(min_replicas: int, max_replicas: int) -> list[str]:
    problems = []
    if min_replicas < 0 or max_replicas < 0:
        problems.append("replica counts cannot be negative")
    elif max_replicas < min_replicas:
        problems.append(f"max replicas ({max_replicas}) is below min replicas ({min_replicas})")
    return problems


def fallback_cycle(start: str, fallbacks: Mapping[str, Iterable[str]]) -> list[str] | None:
    """The loop a model's fallbacks lead back into, or None.

    ``fallbacks`` maps each model to its fallbacks with the proposed change
    already applied, so a loop through models saved earlier is found too.
    """
    path: list[str] = []
    on_path: set[str] = set()
    done: set[str] = set()

    def visit(name: str) -> list[str] | None:
        if name in on_path:
            return [*path[path.index(name) :], name]
        if name in done:
            return None
        path.append(name)
        on_path.add(name)
        for nxt in fallbacks.get(name, ()):
            found = visit(nxt)
            if found:
                return found
        path.pop()
        on_path.discard(name)
        done.add(name)
        return None

    return visit(start)


def fingerprint(definition: Mapping) -> str:
    """A short hash of a profile's definition; it changes when the definition does.

    Computed over canonical JSON (sorted keys) so that the order fields were
    written in does not matter, and only over what changes how the engine
    runs: renaming a profile or reordering profiles is not a change.
    """
    body = json.dumps(definition, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(body.encode()).hexdigest()[:16]
