"""Model weights on this machine's disks: GGUF files, safetensors folders and Hugging Face caches under the model dirs.

The scan is bounded (depth, time) so a model dir on a slow network share
cannot hold a report back; what it could not read is said in its problems.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterable
from pathlib import Path

WEIGHT_SUFFIXES = (".safetensors", ".gguf", ".bin", ".pt", ".pth")
MAX_DEPTH = 6
SCAN_BUDGET_S = 10.0
_GGUF_SHARD_RE = re.compile(r"^(.*)-(\d{5})-of-(\d{5})\.gguf$")


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def _gguf_entries(directory: str, files: list[str], root: str) -> list[dict]:
    """One entry per model: the shards of ``name-0000N-of-0000M.gguf`` are one model."""
    entries: list[dict] = []
    shards: dict[tuple[str, int], list[str]] = {}
    for name in sorted(f for f in files if f.lower().endswith(".gguf")):
        match = _GGUF_SHARD_RE.match(name)
        if match:
            shards.setdefault((match.group(1), int(match.group(3))), []).append(name)
            continue
        path = os.path.join(directory, name)
        entries.append({"path": path, "format": "gguf", "bytes": _size(path), "name": _rel(path, root)[:-5]})
    for (stem, total), names in shards.items():
        paths = [os.path.join(directory, n) for n in names]
        entry = {
            "path": paths[0],
            "format": "gguf",
            "bytes": sum(_size(p) for p in paths),
            "name": _rel(os.path.join(directory, stem), root),
            "parts": total,
        }
        if len(names) != total:
            entry["incomplete"] = True
        entries.append(entry)
    return entries


def _rel(path: str, root: str) -> str:
    rel = os.path.relpath(path, root)
    return os.path.basename(path) if rel == "." else rel.replace(os.sep, "/")


def _hf_cache_entries(repo_dir: str) -> list[dict]:
    """``models--org--name/snapshots/<rev>``: one entry per snapshot that holds weight files."""
    name = "/".join(os.path.basename(repo_dir).split("--")[1:])
    snapshots = os.path.join(repo_dir, "snapshots")
    incomplete_blobs = any(n.endswith(".incomplete") for n in _listdir(os.path.join(repo_dir, "blobs")))
    entries = []
    for rev in sorted(_listdir(snapshots)):
        path = os.path.join(snapshots, rev)
        size, has_weights, broken = _snapshot_size(path)
        if not has_weights:
            continue
        entry = {"path": path, "format": "hf-cache", "bytes": size, "name": name, "revision": rev}
        if broken or incomplete_blobs:
            entry["incomplete"] = True
        entries.append(entry)
    return entries


def _snapshot_size(path: str) -> tuple[int, bool, bool]:
    """Bytes of the blobs a snapshot links to (each blob once), whether any is a weight file, any link broken."""
    seen: set[tuple[int, int]] = set()
    size, has_weights, broken = 0, False, False
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            try:
                st = os.stat(os.path.join(dirpath, name))
            except OSError:
                broken = True  # a link whose blob is not downloaded yet
                continue
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                size += st.st_size
            has_weights = has_weights or name.lower().endswith(WEIGHT_SUFFIXES)
    return size, has_weights, broken


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def scan_weights(
    model_dirs: Iterable[Path],
    max_depth: int = MAX_DEPTH,
    budget_s: float = SCAN_BUDGET_S,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[list[dict], list[str]]:
    """Weights under each model dir, and problem sentences (a missing dir, a scan cut short).

    Formats: ``gguf`` files; ``safetensors`` directories (``config.json`` beside ``*.safetensors``,
    not searched further); ``hf-cache`` snapshots (``models--org--name/snapshots/<rev>``).
    The walk stops ``max_depth`` levels down and after ``budget_s`` seconds in all, so a huge
    shared filesystem cannot stall the report; a cut-short scan says so.
    """
    deadline = clock() + budget_s
    found: list[dict] = []
    problems: list[str] = []
    visited: set[tuple[int, int]] = set()
    for model_dir in model_dirs:
        root = str(model_dir)
        if not os.path.isdir(root):
            problems.append(f"model dir {root} does not exist or is not a directory")
            continue
        if not _walk(root, root, 0, max_depth, deadline, clock, visited, found):
            problems.append(f"scan of model dir {root} stopped after {budget_s:g} s; the weights list is incomplete")
            break
    found.sort(key=lambda e: e["path"])
    return found, problems


def _walk(
    directory: str,
    root: str,
    depth: int,
    max_depth: int,
    deadline: float,
    clock: Callable[[], float],
    visited: set[tuple[int, int]],
    found: list[dict],
) -> bool:
    """Depth-first walk; False when the time budget ran out."""
    if clock() > deadline:
        return False
    try:
        st = os.stat(directory)
    except OSError:
        return True
    if (st.st_dev, st.st_ino) in visited:
        return True  # a symlink loop, or a dir reached twice through links
    visited.add((st.st_dev, st.st_ino))
    if os.path.basename(directory).startswith("models--") and os.path.isdir(os.path.join(directory, "snapshots")):
        found.extend(_hf_cache_entries(directory))
        return True
    files, subdirs = _entries(directory)
    if "config.json" in files and any(f.endswith(".safetensors") for f in files):
        weights = [os.path.join(directory, f) for f in files if f.endswith(".safetensors")]
        found.append(
            {
                "path": directory,
                "format": "safetensors",
                "bytes": sum(_size(p) for p in weights),
                "name": _rel(directory, root),
            }
        )
        return True
    found.extend(_gguf_entries(directory, files, root))
    if depth >= max_depth:
        return True
    for sub in subdirs:
        if not _walk(os.path.join(directory, sub), root, depth + 1, max_depth, deadline, clock, visited, found):
            return False
    return True


def _entries(directory: str) -> tuple[list[str], list[str]]:
    files, subdirs = [], []
    try:
        with os.scandir(directory) as it:
            for entry in it:
                try:
                    if entry.is_dir():
                        # Dot directories hold tool state (.git, .locks), except the usual home of the HF cache.
                        if not entry.name.startswith(".") or entry.name == ".cache":
                            subdirs.append(entry.name)
                    else:
                        files.append(entry.name)
                except OSError:
                    continue
    except OSError:
        pass
    return sorted(files), sorted(subdirs)
