"""Deleting weights an operator asked to have collected — only ever under the configured model directories.

The control plane names paths; the agent decides whether they are its to
delete. A path outside every model directory (or reaching outside one through
a symbolic link) is refused with that reason, so a mistake or a compromised
control plane cannot make an agent delete anything else.
"""

from __future__ import annotations

import shutil
from pathlib import Path


def inside(path: Path, roots: list[Path]) -> bool:
    real = path.resolve()
    return any(real != root.resolve() and real.is_relative_to(root.resolve()) for root in roots)


def collect(paths: list[str], model_dirs: list[Path]) -> list[dict]:
    """{"path"} for each deleted path, {"path", "error"} for each refused or failed one."""
    results = []
    for text in paths:
        path = Path(text)
        if not model_dirs:
            results.append({"path": text, "error": "this agent has no model directories configured"})
        elif not inside(path, model_dirs):
            results.append({"path": text, "error": "not under a model directory of this node; left alone"})
        elif not path.exists():
            results.append({"path": text})  # already gone: the request is satisfied
        else:
            try:
                shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
                results.append({"path": text})
            except OSError as exc:
                results.append({"path": text, "error": f"could not delete: {exc.strerror}"})
    return results
