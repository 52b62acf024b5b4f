"""Deleting weights an operator asked to have collected — only ever under the configured model directories.

The control plane names paths; the agent decides whether they are its to
delete. For each path, right before deleting it:

1. It must lie strictly below a model directory, reached from that directory
   without passing through a symbolic link (a link could lead anywhere).
2. It must not be a model directory, nor hold one (model directories may
   nest: ``/data`` and ``/data/models/llama``).
3. It must not overlap weights a shard on this node uses now (asked afresh
   for every path: a shard may have started since the control plane asked).
4. It is then deleted through directory descriptors opened along that same
   walk, never by name from the top again: a directory swapped for a link
   after the check cannot redirect the deletion.

What is deleted is what frees the weights: a Hugging Face cache snapshot
(``models--org--name/snapshots/<rev>``, a folder of links) takes the blobs
only it links to, and the whole ``models--…`` repository when it was the
last snapshot; the first part of a split GGUF takes every part.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

GGUF_PART_RE = re.compile(r"^(.*)-(\d{5})-of-(\d{5})\.gguf$")
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


class Refused(Exception):
    """Why a path is not this agent's to delete, in one sentence."""


def collect(paths: list[str], model_dirs: list[Path], in_use: Callable[[], Iterable[Path]] = tuple) -> list[dict]:
    """{"path"} for each deleted path (or one already gone), {"path", "error"} for each refused or failed one.

    ``in_use`` names the weights this node's shards use; it is called again
    before every deletion.
    """
    if not model_dirs:
        return [{"path": text, "error": "this agent has no model directories configured"} for text in paths]
    roots = _roots(model_dirs)
    results = []
    for text in paths:
        try:
            _delete(text, roots, in_use)
            results.append({"path": text})
        except Refused as exc:
            results.append({"path": text, "error": f"{exc}; left alone"})
        except FileNotFoundError:
            results.append({"path": text})  # already gone: the request is satisfied
        except OSError as exc:
            results.append({"path": text, "error": f"could not delete: {exc.strerror or exc}"})
    return results


def _roots(model_dirs: Iterable[Path]) -> list[tuple[str, str]]:
    """Each model directory as written and as it really is (it may itself be a link the operator made)."""
    return [(os.path.normpath(os.path.abspath(d)), os.path.realpath(d)) for d in model_dirs]


def _locate(text: str, roots: list[tuple[str, str]]) -> tuple[str, list[str]]:
    """The real model directory the path lies under, and the path's parts below it."""
    if not os.path.isabs(text) or "\0" in text:
        raise Refused("not an absolute path")
    path = os.path.normpath(text)
    if any(path in root for root in roots):
        raise Refused("it is a model directory of this node, and a model directory is never deleted")
    for written, real in roots:
        for base in (written, real):
            rel = os.path.relpath(path, base)
            if rel != "." and not rel.startswith(".."):
                return real, rel.split(os.sep)
    raise Refused("not under a model directory of this node")


def _overlaps(a: str, b: str) -> bool:
    return a == b or a.startswith(b.rstrip(os.sep) + os.sep) or b.startswith(a.rstrip(os.sep) + os.sep)


def _check(target: str, roots: list[tuple[str, str]], in_use: Callable[[], Iterable[Path]]) -> None:
    for _, real in roots:
        if real == target or real.startswith(target + os.sep):
            raise Refused(f"it is or holds the model directory {real}, and a model directory is never deleted")
    for used in in_use():
        if any(_overlaps(target, p) for p in {os.path.normpath(os.path.abspath(used)), os.path.realpath(used)}):
            raise Refused(f"in use by a shard this node runs ({used})")


def _delete(text: str, roots: list[tuple[str, str]], in_use: Callable[[], Iterable[Path]]) -> None:
    root, parts = _locate(text, roots)
    _check(os.path.join(root, *parts), roots, in_use)
    with _walk(root, parts[:-1]) as fd:
        name = parts[-1]
        mode = os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode
        if len(parts) >= 3 and parts[-2] == "snapshots" and parts[-3].startswith("models--"):
            _snapshot(root, parts, fd, lambda repo: _check(repo, roots, in_use))
        elif stat.S_ISDIR(mode):
            shutil.rmtree(name, dir_fd=fd)
        elif GGUF_PART_RE.match(name):
            for part in _gguf_parts(name, os.listdir(fd)):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(part, dir_fd=fd)
        else:
            os.unlink(name, dir_fd=fd)  # a file, or a link itself (never what it points to)


@contextlib.contextmanager
def _walk(root: str, parts: list[str]) -> Iterator[int]:
    """A descriptor of ``root/parts…``, each step opened without following a link."""
    fd = os.open(root, _DIR_FLAGS & ~os.O_NOFOLLOW)  # the model directory itself may be a link
    try:
        for part in parts:
            try:
                step = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (getattr(os, "ELOOP", 40), getattr(os, "ENOTDIR", 20)):
                    raise Refused(f"{part} is a symbolic link (or not a directory) on the way there") from None
                raise
            os.close(fd)
            fd = step
        yield fd
    finally:
        os.close(fd)


def _gguf_parts(first: str, names: list[str]) -> list[str]:
    """Every part of the split GGUF whose first part is ``first`` (the same stem and part count)."""
    stem, _, total = GGUF_PART_RE.match(first).groups()
    return [n for n in names if (m := GGUF_PART_RE.match(n)) and m.group(1) == stem and m.group(3) == total]


def _snapshot(root: str, parts: list[str], snapshots_fd: int, check: Callable[[str], None]) -> None:
    """One snapshot of a Hugging Face cache repo, with the blobs no other snapshot links to.

    ``check`` is run on the whole repository before it is deleted (the last snapshot).
    """
    rev = parts[-1]
    others = [r for r in os.listdir(snapshots_fd) if r != rev]
    if not others:
        # The last snapshot: the repository holds nothing else worth keeping.
        check(os.path.join(root, *parts[:-2]))
        with _walk(root, parts[:-3]) as parent:
            shutil.rmtree(parts[-3], dir_fd=parent)
        return
    mine = _blobs_of(snapshots_fd, rev)
    kept = set().union(*(_blobs_of(snapshots_fd, r) for r in others))
    shutil.rmtree(rev, dir_fd=snapshots_fd)
    with _walk(root, parts[:-2]) as repo:
        with contextlib.suppress(FileNotFoundError), _walk_fd(repo, "blobs") as blobs:
            for blob in mine - kept:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(blob, dir_fd=blobs)
        with contextlib.suppress(FileNotFoundError), _walk_fd(repo, "refs") as refs:
            _drop_refs(refs, rev)


@contextlib.contextmanager
def _walk_fd(parent: int, name: str) -> Iterator[int]:
    fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
    try:
        yield fd
    finally:
        os.close(fd)


def _blobs_of(snapshots_fd: int, rev: str) -> set[str]:
    """The blob names a snapshot's links point at (``../../blobs/<hash>``, deeper for nested files)."""
    blobs: set[str] = set()
    # Each descriptor fwalk yields is closed once the walk moves on: use it within the loop.
    for _dirpath, dirnames, filenames, dirfd in os.fwalk(rev, dir_fd=snapshots_fd):
        for name in (*filenames, *dirnames):
            with contextlib.suppress(OSError):
                target = os.readlink(name, dir_fd=dirfd).split("/")
                if len(target) >= 2 and target[-2] == "blobs":
                    blobs.add(target[-1])
    return blobs


def _drop_refs(refs_fd: int, rev: str) -> None:
    """Branch and tag names (``refs/main``, ``refs/pr/1``) that point at the collected revision."""
    for _dirpath, _dirs, filenames, dirfd in os.fwalk(".", dir_fd=refs_fd):
        for name in filenames:
            with contextlib.suppress(OSError):
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=dirfd)
                with os.fdopen(fd, "rb") as fh:
                    if fh.read(200).strip() == rev.encode():
                        os.unlink(name, dir_fd=dirfd)
