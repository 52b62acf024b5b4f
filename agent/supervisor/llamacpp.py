"""llama.cpp's command line, through llama-cpp-python's server (``llama-cpp-python[server]``):
``python -m llama_cpp.server --model <gguf> --host H --port P``.

The weights may be a directory: the server wants one GGUF file, so the
largest ``.gguf`` in it is taken (split files are not supported here).

Its settings are also read from the environment, and there ``HOST`` and
``PORT`` beat the flags and ``CONFIG_FILE`` replaces them all; so the
environment names the address too, drops ``CONFIG_FILE``, and carries the
replica's key as ``API_KEY`` (out of ``ps``; every route but ``/docs``
then wants it). All three hold in config-file mode as well (0.3.36:
``HOST`` and ``PORT`` are read by ``__main__``, ``API_KEY`` fills the
file's missing ``api_key``), so the file never holds the key.

LoRA adapters: the server holds one model at a time, and its one
``--lora_path`` applies to every request; but from a config file it serves
several model names, loading each on demand (``LlamaProxy``). A model with
adapters therefore starts as ``--config_file <shard dir>/llamacpp.json``:
the base GGUF under the model's name, then the same GGUF once per adapter
under the adapter's name with ``lora_path`` its GGUF (the largest ``.gguf``
the adapter's weights hold; an adapter with none is left out, logged). The
profile's ``engine_args`` are read with the server's own parser and written
into each entry (model settings) or the file's top (server settings); one
it cannot parse fails the shard, saying why. A request for another name
than the one loaded closes the model and loads the other: every switch
costs a reload, so the gateway sends an adapter's requests to a vLLM or
SGLang replica holding it while one is left. Adapters added later wait for
the replica's next start. Without adapters the command line is as above.

The server prints no request bodies, verbose or not (llama-cpp-python
0.3.36: model metadata, timings and cache hits only).

It serves one request at a time, and by default a new request cuts off the
stream in progress (``interrupt_requests``): behind a gateway that routes
several clients to one replica that breaks every stream but the last, so it
is turned off here, on the command line and in the config file alike (a
profile may still turn it on in its arguments).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from agent.supervisor.spec import ShardSpec

PROBE_PATHS = ("/v1/models",)
LORA = True
"""This engine serves LoRA adapters given at start (see the module's docstring)."""
RUN_DIR = True
"""``command`` takes the shard's own directory, to write the config file in."""
CONFIG_NAME = "llamacpp.json"
# The agent sets these itself: the address by HOST and PORT, the key by API_KEY (a key in the file would beat it).
OURS = ("host", "port", "api_key")


class CannotStart(Exception):
    """The shard cannot start as given; the message says why."""


class NoGguf(CannotStart):
    """The weights hold no GGUF file for llama.cpp to load."""


def gguf_file(weights: str) -> str:
    path = Path(weights)
    if path.is_dir():
        files = sorted(path.rglob("*.gguf"), key=lambda p: (-p.stat().st_size, str(p)))
        if not files:
            raise NoGguf(f"{weights} holds no .gguf file, which llama.cpp needs")
        return str(files[0])
    return str(path)


def lora_slots(spec: ShardSpec) -> int:
    """Every adapter the model has: each is a name in the config file, loaded only when asked for."""
    return len(spec.adapters)


def lora_file(fetched: str) -> str:
    """The file llama.cpp loads as an adapter: the largest GGUF in what was fetched (NoGguf when none)."""
    return gguf_file(fetched)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse exits the process by default
        raise CannotStart(message)


def profile_settings(engine_args: Sequence[str]) -> tuple[dict, dict]:
    """The profile's ``engine_args`` as llama-cpp-python's server reads its flags: (server, model) settings.

    Parsed with the server's own parser (its flags, types and abbreviations), so an argument means in the
    config file what it means on the command line.
    """
    try:
        from llama_cpp.server.cli import add_args_from_model
        from llama_cpp.server.settings import ModelSettings, Settings
    except ImportError as exc:
        raise CannotStart(f"llama-cpp-python's server cannot be imported beside the agent: {exc}") from exc
    parser = _Parser(prog="llama_cpp.server", add_help=False)
    add_args_from_model(parser, Settings)
    try:
        given = {k: v for k, v in vars(parser.parse_args(list(engine_args))).items() if v is not None}
    except CannotStart as exc:
        raise CannotStart(f"the profile's engine_args cannot go in llama.cpp's config file: {exc}") from exc
    model = {k: v for k, v in given.items() if k in ModelSettings.model_fields}
    server = {k: v for k, v in given.items() if k not in model and k not in OURS}
    return server, model


def config(spec: ShardSpec, model_file: str, host: str, port: int, adapters: Mapping[str, str]) -> dict:
    """The server's config file: the base under the model's name, then one entry per adapter (name to GGUF)."""
    server, model = profile_settings(spec.engine_args)
    # lora_path is always written: the server's settings read LORA_PATH from the environment where it is missing.
    base = {**model, "model": model_file, "model_alias": spec.model, "lora_path": model.get("lora_path")}
    entries = [base] + [{**base, "model_alias": n, "lora_path": p} for n, p in sorted(adapters.items())]
    return {"interrupt_requests": False, **server, "host": host, "port": port, "models": entries}


def command(
    spec: ShardSpec,
    weights: str,
    port: int,
    host: str,
    adapters: Mapping[str, str] | None = None,
    run_dir: Path | None = None,
) -> list[str]:
    """``adapters`` are name to GGUF file (:func:`lora_file`); with any, the config file goes in ``run_dir``."""
    head = [sys.executable, "-m", "llama_cpp.server"]
    if not adapters:
        # The profile's arguments come first, so where one repeats a flag ours win; except the default
        # before them, which the profile may change.
        tail = ["--model", gguf_file(weights), "--model_alias", spec.model, "--host", host, "--port", str(port)]
        return [*head, "--interrupt_requests", "False", *spec.engine_args, *tail]
    if run_dir is None:
        raise CannotStart("llama.cpp's adapters need a directory for the server's config file")
    body = json.dumps(config(spec, gguf_file(weights), host, port, adapters), indent=2)
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / CONFIG_NAME
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(body + "\n")
    return [*head, "--config_file", str(path)]


def environment(spec: ShardSpec, host: str, port: int) -> dict[str, str | None]:
    """What the engine's environment must hold (None: must not hold) whatever the node's own says."""
    return {"HOST": host, "PORT": str(port), "CONFIG_FILE": None, "API_KEY": spec.api_key or None}


def serves_api(spec: ShardSpec) -> bool:
    return True
