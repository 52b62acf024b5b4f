"""llama.cpp's command line, through llama-cpp-python's server (``llama-cpp-python[server]``):
``python -m llama_cpp.server --model <gguf> --port P --host 0.0.0.0``.

The weights may be a directory: the server wants one GGUF file, so the
largest ``.gguf`` in it is taken (split files are not supported here).
"""

from __future__ import annotations

import sys
from pathlib import Path

from agent.supervisor.spec import ShardSpec

PROBE_PATHS = ("/v1/models",)


class NoGguf(Exception):
    """The weights hold no GGUF file for llama.cpp to load."""


def gguf_file(weights: str) -> str:
    path = Path(weights)
    if path.is_dir():
        files = sorted(path.rglob("*.gguf"), key=lambda p: (-p.stat().st_size, str(p)))
        if not files:
            raise NoGguf(f"{weights} holds no .gguf file, which llama.cpp needs")
        return str(files[0])
    return str(path)


def command(spec: ShardSpec, weights: str, port: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "llama_cpp.server",
        "--model",
        gguf_file(weights),
        "--model_alias",
        spec.model,
        "--host",
        "0.0.0.0",
        "--port",
        str(port),
        *spec.engine_args,
    ]


def serves_api(spec: ShardSpec) -> bool:
    return True
