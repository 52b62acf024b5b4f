"""SGLang's command line: ``python -m sglang.launch_server --model-path <model> --host H --port P --tp-size tp ...``.

The replica's key is given as ``--api-key``: SGLang reads it from nowhere
else. It therefore shows in ``ps`` on the node, and SGLang prints its
arguments at start; the supervisor blanks the key out of every log line it
sends to the control plane.

LoRA adapters: each fetched adapter is given as ``--lora-paths name=path``
after ``--enable-lora``; SGLang serves one as ``<model>:<adapter>`` (the
gateway names it so upstream). Adapters added later wait for the replica's
next start: llmgw loads adapters at runtime into vLLM only.

Requests stay out of the log: SGLang logs them only when given
``--log-requests``, which profiles may not pass (agent.launch_rules).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping

from agent.supervisor.spec import ShardSpec

PROBE_PATHS = ("/health", "/v1/models")
LORA = True
"""This engine serves LoRA adapters given at start."""


def lora_slots(spec: ShardSpec) -> int:
    """Every adapter the model has: SGLang keeps them in host memory and swaps them in per batch."""
    return len(spec.adapters)


def command(
    spec: ShardSpec, weights: str, port: int, host: str, adapters: Mapping[str, str] | None = None
) -> list[str]:
    """``adapters`` are the fetched LoRA adapters, name to local path."""
    # The profile's arguments come first, so where one repeats a flag ours win.
    cmd = [sys.executable, "-m", "sglang.launch_server", *spec.engine_args, "--model-path", weights]
    cmd += ["--served-model-name", spec.model, "--host", host, "--port", str(port), "--tp-size", str(spec.tp)]
    if spec.api_key:
        cmd += ["--api-key", spec.api_key]
    if spec.pp > 1:
        cmd += ["--pp-size", str(spec.pp)]
    dist = spec.distributed_env()
    if dist:
        addr = f"{dist['MASTER_ADDR']}:{dist['MASTER_PORT']}"
        cmd += ["--nnodes", dist["WORLD_SIZE"], "--node-rank", dist["NODE_RANK"], "--dist-init-addr", addr]
    if adapters:
        cmd += ["--enable-lora", "--lora-paths", *(f"{name}={path}" for name, path in sorted(adapters.items()))]
    return cmd


def environment(spec: ShardSpec, host: str, port: int) -> dict[str, str | None]:
    """What the engine's environment must hold (None: must not hold) whatever the node's own says."""
    return {}


def serves_api(spec: ShardSpec) -> bool:
    return spec.rank == 0
