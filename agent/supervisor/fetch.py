"""Weights onto this node: ``hf://org/name``, ``file:///path``, ``https://…``; what is already here is used as is.

Progress is reported as bytes done and, when the source says, bytes total; a
source that gives no size (a server without Content-Length, the Hugging Face
hub here) shows bytes only — an invented percentage that stops moving
misleads more than a plain count.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.util
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

import httpx

CHUNK = 1 << 20


class FetchError(Exception):
    """The weights could not be had, in one sentence."""


@dataclass
class Progress:
    source: str
    bytes_done: int = 0
    bytes_total: int | None = None
    downloaded: bool = False
    """True once bytes were actually brought onto this node (False: the weights were here already)."""

    def as_status(self) -> dict:
        out: dict = {"source": self.source, "bytes_done": self.bytes_done}
        if self.bytes_total is not None:
            out["bytes_total"] = self.bytes_total
        return out


def download_dir(model_dirs: Sequence[Path], fallback: Path) -> Path:
    """Where downloads go: the first model dir given, else the agent's state dir."""
    return model_dirs[0] if model_dirs else fallback


async def fetch(source: str, into: Path, progress: Progress, on_progress: Callable[[], None] = lambda: None) -> Path:
    """The local path of ``source``'s weights, fetched into ``into`` when they are not here yet."""
    if not source:
        raise FetchError("the model has no source: give it one (hf://…, file:///…, https://…)")
    if source.startswith("file://"):
        return _local(source, progress)
    if source.startswith(("https://", "http://")):
        return await _download(source, into, progress, on_progress)
    if source.startswith("hf://"):
        return await _huggingface(source, into, progress)
    raise FetchError(f"source {source!r} is not hf://, file:// or https://")


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _local(source: str, progress: Progress) -> Path:
    path = Path(unquote(urlparse(source).path))
    if not path.exists():
        raise FetchError(f"{path} does not exist on this node")
    progress.bytes_done = progress.bytes_total = _size(path)
    return path


async def _download(url: str, into: Path, progress: Progress, on_progress: Callable[[], None]) -> Path:
    name = Path(urlparse(url).path).name or "weights"
    target = into / hashlib.sha256(url.encode()).hexdigest()[:16] / name
    if target.exists():
        progress.bytes_done = progress.bytes_total = target.stat().st_size
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".part")
    try:
        timeout = httpx.Timeout(30, read=300)
        async with (
            httpx.AsyncClient(follow_redirects=True, timeout=timeout) as client,
            client.stream("GET", url) as answer,
        ):
            if answer.status_code != 200:
                raise FetchError(f"{url} answered {answer.status_code}")
            length = answer.headers.get("content-length")
            progress.bytes_total = int(length) if length and length.isdigit() else None
            progress.downloaded = True
            with partial.open("wb") as fh:
                async for chunk in answer.aiter_bytes(CHUNK):
                    fh.write(chunk)
                    progress.bytes_done += len(chunk)
                    on_progress()
    except httpx.HTTPError as exc:
        raise FetchError(f"downloading {url} failed: {type(exc).__name__}: {exc}") from None
    os.replace(partial, target)
    return target


async def _huggingface(source: str, into: Path, progress: Progress) -> Path:
    if importlib.util.find_spec("huggingface_hub") is None:
        raise FetchError("hf:// needs huggingface_hub: pip install huggingface_hub on this node")
    repo = source.removeprefix("hf://").strip("/")
    from huggingface_hub import snapshot_download

    # The hub's cache says nothing about whether it downloaded: a folder already there counts as local.
    progress.downloaded = not (into / "hf" / ("models--" + repo.split("@", 1)[0].replace("/", "--"))).exists()

    try:
        path = Path(await asyncio.to_thread(snapshot_download, repo_id=repo, cache_dir=str(into / "hf")))
    except Exception as exc:  # noqa: BLE001 - the hub raises many kinds; each becomes the shard's error
        raise FetchError(f"fetching {source} failed: {type(exc).__name__}: {exc}") from None
    progress.bytes_done = _size(path)
    return path
