"""vLLM's command line: ``vllm serve <model> --host H --port P --tensor-parallel-size tp ...``.

A multi-node shard uses vLLM's own multi-node launcher (``--nnodes``,
``--node-rank``, ``--master-addr``); ranks other than 0 run headless, serving
no API, so only rank 0's endpoint is probed.

The replica's key goes in ``VLLM_API_KEY``, not ``--api-key``: vLLM prints
its non-default arguments at start, and that log's tail reaches the control
plane; the environment also keeps it out of ``ps`` on the node. vLLM checks
the key on ``/v1/…`` paths only.

LoRA adapters: a model with adapters starts with ``--enable-lora``, each
fetched adapter as ``--lora-modules name=path`` and ``--max-loras`` (the
profile's own, else room for every adapter and ``LORA_SLOTS`` at least), and
with ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`` so an adapter added to the
catalog later is loaded into the running engine (``POST
/v1/load_lora_adapter``) while it has room. A model with no adapters starts
without LoRA, which costs memory and speed; an adapter given to it later
waits for the replica's next start.

Requests stay out of the log: vLLM 0.10.1 and later log none unless told
(``--enable-log-requests``), and ``--no-enable-log-requests`` says so
explicitly; older releases log every prompt unless given
``--disable-log-requests`` (which 0.12 removed), so the flag follows the
vLLM installed beside the agent, and a vLLM it cannot see is taken to be current.
"""

from __future__ import annotations

import functools
import importlib.metadata
import re
from collections.abc import Mapping

from agent.supervisor.spec import ShardSpec

PROBE_PATHS = ("/health", "/v1/models")
QUIET_SINCE = (0, 10, 1)
LORA_SLOTS = 4
LORA = True
"""This engine serves LoRA adapters given at start."""
RUNTIME_LORA = True
"""This engine loads an adapter into a running replica (see :func:`lora_slots`)."""


@functools.cache
def installed_version() -> tuple[int, ...] | None:
    """vLLM's release beside the agent, as numbers; None when it is not installed here."""
    try:
        text = importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return None
    return tuple(int(n) for n in re.findall(r"\d+", text)[:3]) or None


def quiet_flag(version: tuple[int, ...] | None) -> str:
    """The flag that keeps prompts out of this vLLM's log."""
    if version is not None and version < QUIET_SINCE:
        return "--disable-log-requests"
    return "--no-enable-log-requests"


def lora_slots(spec: ShardSpec) -> int:
    """How many adapters the replica holds at once: the profile's ``--max-loras``, else room for every adapter
    the model has (``LORA_SLOTS`` at least, so a few added later load without a restart); 0 without LoRA."""
    if not spec.adapters:
        return 0
    args = list(spec.engine_args)
    for i, arg in enumerate(args):
        value = arg.split("=", 1)[1] if arg.startswith("--max-loras=") else None
        if arg == "--max-loras" and i + 1 < len(args):
            value = args[i + 1]
        if value is not None and value.isdigit():
            return int(value)
    return max(len(spec.adapters), LORA_SLOTS)


def _has_flag(spec: ShardSpec, flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in spec.engine_args)


def command(
    spec: ShardSpec, weights: str, port: int, host: str, adapters: Mapping[str, str] | None = None
) -> list[str]:
    """``adapters`` are the fetched LoRA adapters, name to local path, at most :func:`lora_slots` of them."""
    # The profile's arguments come first: where one repeats a flag, the last
    # one counts, so the address and the logging below always win.
    cmd = ["vllm", "serve", weights, *spec.engine_args, "--served-model-name", spec.model]
    if spec.adapters:
        cmd.append("--enable-lora")
        if not _has_flag(spec, "--max-loras"):
            cmd += ["--max-loras", str(lora_slots(spec))]
        if adapters:
            cmd += ["--lora-modules", *(f"{name}={path}" for name, path in sorted(adapters.items()))]
    cmd += ["--host", host, "--port", str(port), "--tensor-parallel-size", str(spec.tp)]
    cmd.append(quiet_flag(installed_version()))
    if spec.pp > 1:
        cmd += ["--pipeline-parallel-size", str(spec.pp)]
    dist = spec.distributed_env()
    if dist:
        cmd += ["--nnodes", dist["WORLD_SIZE"], "--node-rank", dist["NODE_RANK"]]
        cmd += ["--master-addr", dist["MASTER_ADDR"], "--master-port", dist["MASTER_PORT"]]
        if spec.rank > 0:
            cmd.append("--headless")
    return cmd


def environment(spec: ShardSpec, host: str, port: int) -> dict[str, str | None]:
    """What the engine's environment must hold (None: must not hold) whatever the node's own says."""
    env: dict[str, str | None] = {"VLLM_API_KEY": spec.api_key or None}
    if spec.adapters:
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"  # so an adapter added later loads without a restart
    return env


def serves_api(spec: ShardSpec) -> bool:
    return spec.rank == 0
