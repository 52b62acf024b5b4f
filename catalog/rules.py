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


# --- what a profile may hand its engine -------------------------------------------------------
#
# A profile's env and engine_args reach a process on every node the model is
# placed on. They may tune the engine; they may not load code of their
# choosing into it, undo the address and key the agent gives it (which is
# what keeps budgets and rate limits in front of every engine), or make it
# log requests, whose tails reach the control plane (``Shard.error``).

ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Python reads these and runs nothing: a profile may set them.
PYTHON_ENV_ALLOWED = frozenset(
    {"PYTHONUNBUFFERED", "PYTHONHASHSEED", "PYTHONFAULTHANDLER", "PYTHONDONTWRITEBYTECODE", "PYTHONIOENCODING"}
    | {"PYTHONUTF8", "PYTHONWARNDEFAULTENCODING", "PYTHONNODEBUGRANGES"}
)
CODE_ENV = {
    "NODE_OPTIONS": "loads code into Node.js",
    "BASH_ENV": "names a script every bash runs",
    "ENV": "names a script every sh runs",
    "PERL5OPT": "loads code into Perl",
    "PERL5LIB": "chooses where Perl loads code from",
    "PERLLIB": "chooses where Perl loads code from",
    "RUBYOPT": "loads code into Ruby",
    "RUBYLIB": "chooses where Ruby loads code from",
    "GCONV_PATH": "makes the C library load modules from a directory",
    "PATH": "chooses which programs run, the engine itself included",
}
CODE_ENV_PREFIXES = {
    "LD_": "the dynamic linker loads libraries by it",
    "DYLD_": "the dynamic linker loads libraries by it",
    "LLMGW_": "it is reserved for what placement tells the agent",
}
BINDING_ENV = {
    "VLLM_API_KEY": "the agent sets the replica's key itself",
    "API_KEY": "llama.cpp's server takes its key from it, which the agent sets",
    "HOST": "llama.cpp's server listens where it says, over the address the agent gives",
    "PORT": "llama.cpp's server listens where it says, over the port the agent gives",
    "CONFIG_FILE": "llama.cpp's server then takes every setting from that file, address and key included",
}
# Compared by name with '_' read as '-', and by prefix: argparse takes an
# unambiguous abbreviation (``--ho`` for ``--host``) unless told otherwise.
ENGINE_FLAGS = {
    "host": "the agent binds the engine to the node's advertised address",
    "port": "the agent chooses the port",
    "api-key": "the agent gives the engine the replica's key",
    "admin-api-key": "the agent gives the engine the replica's key",
    "uds": "the engine must listen where the gateway can reach it, with the key",
    "config": "the engine then reads its arguments from a file, address and key included",
    "config-file": "the engine then reads its settings from a file, address and key included",
    "middleware": "it imports code into the engine's server",
    "tool-parser-plugin": "it runs a Python file in the engine",
    "reasoning-parser-plugin": "it runs a Python file in the engine",
    "logits-processors": "it imports code into the engine",
    "worker-cls": "it imports code into the engine",
    "worker-extension-cls": "it imports code into the engine",
    "enable-custom-logit-processor": "it lets every client send code for the engine to run",
    "enable-log-requests": "the engine would log prompts, and its log reaches the control plane",
    "enable-log-outputs": "the engine would log completions, and its log reaches the control plane",
    "log-requests": "the engine would log prompts, and its log reaches the control plane",
    "log-requests-level": "the engine would log prompts, and its log reaches the control plane",
}


def env_problem(name: str, value: str) -> str | None:
    """Why a profile may not set this variable for its engine; None when it may."""
    if not ENV_NAME_RE.match(name):
        return "is not a variable name (letters, digits and '_', not starting with a digit)"
    if "\0" in value:
        return "holds a NUL character, which no environment can carry"
    upper = name.upper()
    if upper.startswith("PYTHON") and upper not in PYTHON_ENV_ALLOWED:
        return "Python loads code or chooses where code comes from by it"
    for prefix, why in CODE_ENV_PREFIXES.items():
        if upper.startswith(prefix):
            return why
    return CODE_ENV.get(upper) or BINDING_ENV.get(upper)


def flag_name(arg: str) -> str | None:
    """``--Api_Key=x`` → ``api-key``; None for a value rather than a flag."""
    if not arg.startswith("-") or arg in ("-", "--") or arg[1:2].isdigit():
        return None
    return arg.lstrip("-").split("=", 1)[0].replace("_", "-").lower()


def engine_arg_problem(arg: str) -> str | None:
    """Why a profile may not pass this argument to its engine; None when it may."""
    if "\0" in arg:
        return "holds a NUL character, which no command line can carry"
    name = flag_name(arg)
    if not name:
        return None
    if name in ENGINE_FLAGS:
        return ENGINE_FLAGS[name]
    if arg.startswith("--"):  # only long options are abbreviated
        for flag, why in ENGINE_FLAGS.items():
            if flag.startswith(name):
                return f"argparse reads it as --{flag}: {why}"
    return None


def launch_problems(engine_args: Iterable[str], env: Mapping[str, str], where: str = "") -> list[str]:
    """What a profile's ``engine_args`` and ``env`` may not say, each naming the entry at fault.

    ``where`` prefixes each field's path (``profiles[0].``).
    """
    problems = []
    for i, arg in enumerate(engine_args):
        why = engine_arg_problem(arg)
        if why:
            problems.append(f"{where}engine_args[{i}] {arg[:80]!r} is refused: {why}")
    for name, value in env.items():
        why = env_problem(name, value)
        if why:
            problems.append(f"{where}env.{name[:80]} is refused: {why}")
    return problems
