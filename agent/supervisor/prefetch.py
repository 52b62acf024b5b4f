"""Weights the control plane asked this node to fetch ahead of any shard: fetched, reported, forgotten.

The heartbeat answer's ``prefetch`` lists ``{"model", "source"}`` entries;
each is fetched once with the code a shard's start uses (``fetch.fetch``, into
the same download dir, so a shard started later finds them there). Each
heartbeat carries :meth:`Prefetcher.status` — ``fetching`` with bytes done
(and total when the source says), then ``done`` with the path, or
``failed`` with the reason. An entry the answer stops listing is forgotten
once finished (the control plane has stored its end) and cancelled if not.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from agent.supervisor.fetch import FetchError, Progress, download_dir, fetch

log = logging.getLogger("llmgw.agent.prefetch")


@dataclass
class PrefetchRun:
    model: str
    source: str
    progress: Progress
    state: str = "fetching"
    path: Path | None = None
    error: str = ""
    task: asyncio.Task | None = field(default=None, repr=False)

    def status(self) -> dict:
        out: dict = {"model": self.model, "source": self.source, "state": self.state, **self.progress.as_status()}
        if self.path is not None:
            out["path"] = str(self.path)
        if self.error:
            out["error"] = self.error
        return out


class Prefetcher:
    """Runs the prefetches the control plane hands out; ``apply`` with each heartbeat answer's list."""

    def __init__(
        self,
        *,
        model_dirs: Sequence[Path] = (),
        fallback: Path,
        on_done: Callable[[], None] = lambda: None,
        fetcher: Callable = fetch,
    ) -> None:
        self.into = download_dir(list(model_dirs), fallback)
        self.on_done = on_done
        self.fetcher = fetcher
        self.runs: dict[tuple[str, str], PrefetchRun] = {}

    def apply(self, entries: list[dict]) -> None:
        """Start what is new; forget what is finished and no longer listed; cancel what is unlisted mid-fetch."""
        wanted = {
            (e["model"], e["source"])
            for e in entries
            if isinstance(e, dict) and isinstance(e.get("model"), str) and isinstance(e.get("source"), str)
        }
        for key, run in list(self.runs.items()):
            if key not in wanted:
                if run.task is not None and not run.task.done():
                    run.task.cancel()
                del self.runs[key]
        for key in sorted(wanted - set(self.runs)):
            run = PrefetchRun(model=key[0], source=key[1], progress=Progress(source=key[1]))
            self.runs[key] = run
            run.task = asyncio.create_task(self._run(run), name=f"prefetch:{key[0]}")

    def status(self) -> list[dict]:
        return [run.status() for run in self.runs.values()]

    def in_use(self) -> list[Path]:
        """Weights being fetched or just fetched here: never collected from under a prefetch."""
        return [run.path for run in tuple(self.runs.values()) if run.path is not None]

    async def _run(self, run: PrefetchRun) -> None:
        try:
            run.path = Path(await self.fetcher(run.source, self.into, run.progress))
            run.state = "done"
        except FetchError as exc:
            run.state, run.error = "failed", str(exc)
            log.warning("prefetch of %s failed: %s", run.model, exc)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # any failure is the prefetch's, reported, never the agent's
            run.state, run.error = "failed", f"{type(exc).__name__}: {exc}"
            log.exception("prefetch of %s failed", run.model)
        self.on_done()

    async def close(self) -> None:
        tasks = [r.task for r in self.runs.values() if r.task is not None and not r.task.done()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
