"""vLLM's command line: ``vllm serve <model> --host H --port P --tensor-parallel-size tp ...``.

A multi-node shard uses vLLM's own multi-node launcher (``--nnodes``,
``--node-rank``, ``--master-addr``); ranks other than 0 run headless, serving
no API, so only rank 0's endpoint is probed.

The replica's key goes in ``VLLM_API_KEY``, not ``--api-key``: vLLM prints
its non-default arguments at start, and that log's tail reaches the control
plane; the environment also keeps it out of ``ps`` on the node. vLLM checks
the key on ``/v1/…`` paths only.

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

from agent.supervisor.spec import ShardSpec

PROBE_PATHS = ("/health", "/v1/models")
QUIET_SINCE = (0, 10, 1)


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


def command(spec: ShardSpec, weights: str, port: int, host: str) -> list[str]:
    # The profile's arguments come first: where one repeats a flag, the last
    # one counts, so the address and the logging below always win.
    cmd = ["vllm", "serve", weights, *spec.engine_args, "--served-model-name", spec.model]
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
    return {"VLLM_API_KEY": spec.api_key or None}


def serves_api(spec: ShardSpec) -> bool:
    return spec.rank == 0
