"""The inference engines installed on this machine: in the agent's own Python, or as an executable on PATH.

A key that is absent means the engine was not found; a version that could
not be read is ``None``.
"""

from __future__ import annotations

import importlib.metadata
import re
import shutil
from collections.abc import Callable
from pathlib import Path

from agent.discovery.tools import ToolOutput, run_tool

Run = Callable[[list[str]], ToolOutput]


# Report key → Python distribution; the key is what profiles name as the engine.
PY_ENGINES = {"vllm": "vllm", "sglang": "sglang", "llamacpp": "llama_cpp_python"}
# Report key → (executable on PATH, the distribution whose console script it is, if it is one), for
# engines installed outside the agent's own Python.
EXE_ENGINES: dict[str, tuple[str, str | None]] = {"vllm": ("vllm", "vllm"), "llamacpp": ("llama-server", None)}
_LLAMA_VERSION_RE = re.compile(r"version:\s*(\d+)\s*\(([0-9a-f]+)\)")
_SEMVER_RE = re.compile(r"^v?(\d+\.\d+(?:\.\d+)?(?:[.+\-][\w.+\-]*)?)$")


def parse_engine_version(text: str) -> str | None:
    """``vllm --version`` (``0.6.3``, after any log lines) or ``llama-server --version``
    (``version: 4033 (a9e8a9a0)`` → ``b4033``, the llama.cpp release tag)."""
    llama = _LLAMA_VERSION_RE.search(text)
    if llama:
        return f"b{llama.group(1)}"
    for line in reversed(text.strip().splitlines()):
        match = _SEMVER_RE.match(line.strip())
        if match:
            return match.group(1)
    return None


def version_beside(executable: str, dist: str) -> str | None:
    """A console script's version read from the dist-info of the venv it lives in, without running it
    (``vllm --version`` imports torch and can take longer than a report may wait)."""
    bin_dir = Path(executable).resolve().parent
    pattern = re.compile(rf"^{re.escape(dist).replace('_', '[-_]')}-([^-]+)\.dist-info$", re.IGNORECASE)
    for site in sorted(bin_dir.parent.glob("lib/python3*/site-packages")):
        try:
            names = [p.name for p in site.iterdir()]
        except OSError:
            continue
        for name in names:
            match = pattern.match(name)
            if match:
                return match.group(1)
    return None


def _installed_version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def find_engines(
    run: Run = run_tool,
    version_of: Callable[[str], str | None] = _installed_version,
    which: Callable[[str], str | None] = shutil.which,
) -> dict[str, str | None]:
    """The ``engines`` section: engine → version, for each engine found.

    ``{}`` means we looked and found none. A value of None means the engine is installed
    (its executable is on PATH) but its version could not be read: llama-server prints its
    version on stderr, which run_tool does not keep.
    """
    engines: dict[str, str | None] = {}
    for key, dist in PY_ENGINES.items():
        version = version_of(dist)
        if version:
            engines[key] = version
    for key, (exe, dist) in EXE_ENGINES.items():
        if key in engines:
            continue  # the Python package already named it; no need to start anything
        path = which(exe)
        if path is None:
            continue
        version = version_beside(path, dist) if dist else None
        if version is None:
            out = run([exe, "--version"])
            version = parse_engine_version(out.stdout or "") if out.stdout else None
        engines[key] = version
    return engines
