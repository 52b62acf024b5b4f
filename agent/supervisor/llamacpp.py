"""llama.cpp's command line, through llama-cpp-python's server (``llama-cpp-python[server]``):
``python -m llama_cpp.server --model <gguf> --host H --port P``.

The weights may be a directory: the server wants one GGUF file, so the
largest ``.gguf`` in it is taken (split files are not supported here).

Its settings are also read from the environment, and there ``HOST`` and
``PORT`` beat the flags and ``CONFIG_FILE`` replaces them all; so the
environment names the address too, drops ``CONFIG_FILE``, and carries the
replica's key as ``API_KEY`` (out of ``ps``; every route but ``/docs``
then wants it).

LoRA adapters are not given to it: llama-cpp-python's server applies its one
``--lora_path`` to every request, so a replica started with an adapter could
no longer answer for its base model. A llama.cpp replica serves its base
only, and the gateway sends an adapter's requests to the base's vLLM and
SGLang replicas, which report the adapter loaded. The server prints no request bodies, verbose or not
(llama-cpp-python 0.3.36: model metadata, timings and cache hits only).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
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


def command(
    spec: ShardSpec, weights: str, port: int, host: str, adapters: Mapping[str, str] | None = None
) -> list[str]:
    """``adapters`` are accepted as every engine's are, and left out (see the module's docstring)."""
    # The profile's arguments come first, so where one repeats a flag ours win.
    head = [sys.executable, "-m", "llama_cpp.server", *spec.engine_args]
    return [*head, "--model", gguf_file(weights), "--model_alias", spec.model, "--host", host, "--port", str(port)]


def environment(spec: ShardSpec, host: str, port: int) -> dict[str, str | None]:
    """What the engine's environment must hold (None: must not hold) whatever the node's own says."""
    return {"HOST": host, "PORT": str(port), "CONFIG_FILE": None, "API_KEY": spec.api_key or None}


def serves_api(spec: ShardSpec) -> bool:
    return True
