"""SGLang's command line: ``python -m sglang.launch_server --model-path <model> --port P --tp-size tp ...``."""

from __future__ import annotations

import sys

from agent.supervisor.spec import ShardSpec

PROBE_PATHS = ("/health", "/v1/models")


def command(spec: ShardSpec, weights: str, port: int) -> list[str]:
    cmd = [
        sys.executable,
        "-m",
        "sglang.launch_server",
        "--model-path",
        weights,
        "--served-model-name",
        spec.model,
        "--host",
        "0.0.0.0",
        "--port",
        str(port),
        "--tp-size",
        str(spec.tp),
    ]
    if spec.pp > 1:
        cmd += ["--pp-size", str(spec.pp)]
    dist = spec.distributed_env()
    if dist:
        addr = f"{dist['MASTER_ADDR']}:{dist['MASTER_PORT']}"
        cmd += ["--nnodes", dist["WORLD_SIZE"], "--node-rank", dist["NODE_RANK"], "--dist-init-addr", addr]
    return cmd + list(spec.engine_args)


def serves_api(spec: ShardSpec) -> bool:
    return spec.rank == 0
