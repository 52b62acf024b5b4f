"""vLLM's command line: ``vllm serve <model> --port P --tensor-parallel-size tp ...``.

A multi-node shard uses vLLM's own multi-node launcher (``--nnodes``,
``--node-rank``, ``--master-addr``); ranks other than 0 run headless, serving
no API, so only rank 0's endpoint is probed.
"""

from __future__ import annotations

from agent.supervisor.spec import ShardSpec

PROBE_PATHS = ("/health", "/v1/models")


def command(spec: ShardSpec, weights: str, port: int) -> list[str]:
    cmd = [
        "vllm",
        "serve",
        weights,
        "--served-model-name",
        spec.model,
        "--host",
        "0.0.0.0",
        "--port",
        str(port),
        "--tensor-parallel-size",
        str(spec.tp),
    ]
    if spec.pp > 1:
        cmd += ["--pipeline-parallel-size", str(spec.pp)]
    dist = spec.distributed_env()
    if dist:
        cmd += ["--nnodes", dist["WORLD_SIZE"], "--node-rank", dist["NODE_RANK"]]
        cmd += ["--master-addr", dist["MASTER_ADDR"], "--master-port", dist["MASTER_PORT"]]
        if spec.rank > 0:
            cmd.append("--headless")
    return cmd + list(spec.engine_args)


def serves_api(spec: ShardSpec) -> bool:
    return spec.rank == 0
