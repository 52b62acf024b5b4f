"""The shards this node runs: each one fetched, started, probed, watched, and stopped when no longer wanted.

A shard's life, each step reported in the heartbeat's shard status:

1. ``fetching``: weights not on disk are fetched (bytes done, and total when known).
2. ``starting``: the engine starts with the shard's environment, its output
   going to a log file kept per shard (named by the shard id, which
   ShardSpec checks first); it listens on the node's advertised address
   only, never 0.0.0.0, and wants the replica's key on every request; it is
   probed there (GET /v1/models or /health, with the key) until it answers.
   The model's LoRA adapters are fetched the same way, for engines that
   serve them (vLLM, SGLang, llama.cpp), up to the replica's room for them;
   an engine's own files (llama.cpp's config) go in ``shards/<id>/``,
   removed when the shard stops.
3. ``ready``: answering, at ``http://<advertised host>:<port>``, with the
   adapters it has loaded (``adapters``). An adapter the catalog adds later
   is fetched and loaded into a running vLLM while it has room (its
   ``/v1/load_lora_adapter``); one the catalog drops is unloaded.
   Each shard's start is timed in phases, reported as ``phases``: ``fetch_s``
   (assignment to weights on disk), ``load_s`` (engine started to its first
   answer), each the time so far while it lasts, and ``weights_local`` once
   the fetch is over (true: nothing had to be downloaded). The control plane
   keeps the finished ones to estimate the next cold start.
4. ``failed``: its arguments or environment are outside the allow-list
   (agent.launch_rules: nothing is fetched or started), the fetch failed,
   the engine exited, or it never answered within the start timeout; the
   error comes with the log's last lines. A
   failed shard is not restarted here: the control plane decides what next.
5. ``stopping``: no longer in the heartbeat answer: SIGTERM to the engine's
   process group, then SIGKILL after the stop timeout. Once gone, the shard
   is no longer listed.

The key never leaves the node through this supervisor: every log line it
reports (``log_tail``, and with it the shard's error) has the key blanked
out, the command line it writes into the log included.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlparse

import httpx

from agent.launch_rules import launch_problems
from agent.supervisor.engines import engine
from agent.supervisor.fetch import FetchError, Progress, download_dir, fetch
from agent.supervisor.llamacpp import CannotStart
from agent.supervisor.spec import BadSpec, ShardSpec

log = logging.getLogger("llmgw.agent.supervisor")

LOG_TAIL_LINES = 20
REDACTED = "[key]"
PROBE_INTERVAL_S = 0.5
START_TIMEOUT_S = 1800.0  # a 400 GB checkpoint takes a while to load
STOP_TIMEOUT_S = 30.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("0.0.0.0", 0))
        return sock.getsockname()[1]


def log_tail(path: Path | None, lines: int = LOG_TAIL_LINES, secret: str = "") -> list[str]:
    """The last lines of a log, ``secret`` blanked out; empty when there is none yet."""
    if path is None:
        return []
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 64 * 1024))
            text = fh.read().decode("utf-8", "replace")
    except OSError:
        return []
    if secret:
        text = text.replace(secret, REDACTED)
    return [line[:500] for line in text.splitlines()[-lines:]]


@dataclass
class ShardRun:
    spec: ShardSpec
    state: str = "fetching"
    endpoint: str | None = None
    error: str | None = None
    progress: Progress | None = None
    port: int | None = None
    log_path: Path | None = None
    weights: Path | None = None
    proc: asyncio.subprocess.Process | None = None
    task: asyncio.Task | None = None
    stopper: asyncio.Task | None = None
    history: list[str] = field(default_factory=list)
    began: float = field(default_factory=time.monotonic)
    loading: float | None = None
    """When the engine was started (the fetch is over)."""
    ready_at: float | None = None
    adapters: dict[str, str] = field(default_factory=dict)
    """The LoRA adapters the engine has loaded, name to local path."""
    lora: bool = False
    """The engine serves adapters, so the status says which it has (an empty list too)."""
    loader: asyncio.Task | None = None

    def phases(self, now: float | None = None) -> dict:
        """The start's phases so far, in seconds (see the module's docstring)."""
        now = time.monotonic() if now is None else now
        out: dict = {"fetch_s": round((self.loading or now) - self.began, 3)}
        if self.loading is not None:
            out["load_s"] = round((self.ready_at or now) - self.loading, 3)
            out["weights_local"] = not (self.progress is not None and self.progress.downloaded)
        return out

    def status(self) -> dict:
        out: dict = {"id": self.spec.id, "replica": self.spec.replica, "rank": self.spec.rank, "state": self.state}
        if self.endpoint:
            out["endpoint"] = self.endpoint
        if self.lora and self.state == "ready":
            out["adapters"] = sorted(self.adapters)
        if self.error:
            out["error"] = self.error
        tail = log_tail(self.log_path, secret=self.spec.api_key)
        if tail:
            out["log_tail"] = tail
        if self.progress is not None:
            out["fetch"] = self.progress.as_status()
        if self.state in ("fetching", "starting", "ready"):
            out["phases"] = self.phases()
        return out


class Supervisor:
    """Runs what the control plane says this node should run; ``apply`` with each heartbeat answer."""

    def __init__(
        self,
        *,
        work_dir: Path,
        model_dirs: Sequence[Path] = (),
        advertise_host: str,
        start_timeout_s: float = START_TIMEOUT_S,
        stop_timeout_s: float = STOP_TIMEOUT_S,
        base_env: dict[str, str] | None = None,
    ) -> None:
        self.work_dir = work_dir
        self.model_dirs = list(model_dirs)
        self.advertise_host = advertise_host
        self.start_timeout_s = start_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.base_env = dict(os.environ if base_env is None else base_env)
        self.runs: dict[str, ShardRun] = {}
        self.refused: set[str] = set()

    # --- what the control plane wants -------------------------------------------

    def apply(self, assignments: list[dict]) -> None:
        """Start what is new, stop what is no longer listed; call from the event loop."""
        wanted = {}
        for data in assignments:
            if isinstance(data, dict):
                try:
                    spec = ShardSpec.from_assignment(data)
                except BadSpec as exc:
                    self._refuse(str(exc))
                    continue
                wanted[spec.id] = spec
        for shard_id, run in list(self.runs.items()):
            if shard_id not in wanted and run.stopper is None:
                run.state = "stopping"  # at once, so the next heartbeat says so
                run.stopper = asyncio.create_task(self._stop(run), name=f"stop:{shard_id}")
        for shard_id, spec in wanted.items():
            if shard_id not in self.runs:
                run = ShardRun(spec)
                self.runs[shard_id] = run
                run.task = asyncio.create_task(self._run(run), name=f"shard:{shard_id}")
            elif self.runs[shard_id].spec.adapters != spec.adapters and self.runs[shard_id].stopper is None:
                run = self.runs[shard_id]
                run.spec = spec
                self._load_adapters_soon(run)

    def _refuse(self, why: str) -> None:
        """Logged once: the control plane sends the same assignment with every heartbeat answer."""
        if why not in self.refused:
            self.refused.add(why)
            log.warning("assignment refused: %s", why)

    def status(self) -> list[dict]:
        return [run.status() for run in self.runs.values()]

    def weights_in_use(self) -> list[Path]:
        """The weights the shards here use or are fetching: never collected from under them.

        Safe to call from another thread (collecting runs on one): it reads a copy of the runs.
        """
        used: list[Path] = []
        for run in tuple(self.runs.values()):
            if run.weights is not None:
                used.append(run.weights)
            used += source_paths(run.spec.source, self.model_dirs, self.work_dir / "weights")
            used += [Path(p) for p in tuple(run.adapters.values())]
            for _, source in run.spec.adapters:
                used += source_paths(source, self.model_dirs, self.work_dir / "weights")
        return used

    async def close(self) -> None:
        """Stop every shard (the agent is shutting down)."""
        for run in list(self.runs.values()):
            if run.stopper is None:
                run.state = "stopping"
                run.stopper = asyncio.create_task(self._stop(run))
        await asyncio.gather(*(r.stopper for r in list(self.runs.values()) if r.stopper), return_exceptions=True)

    # --- one shard ------------------------------------------------------------------

    def _fail(self, run: ShardRun, error: str) -> None:
        if run.state == "stopping":
            return
        run.state, run.error, run.endpoint = "failed", error, None
        log.warning("shard %s failed: %s", run.spec.id, error)

    async def _run(self, run: ShardRun) -> None:
        spec = run.spec
        module = engine(spec.engine)
        if module is None:
            self._fail(run, f"engine {spec.engine!r} is not one this agent can run")
            return
        # The catalog refused these already; checked again so that no control plane, older or tampered
        # with, starts an engine with arguments or environment outside the allow-list.
        refused = launch_problems(spec.engine or "", spec.engine_args, spec.environment, placed=True)
        if refused:
            self._fail(run, "not started: " + "; ".join(refused))
            return
        run.lora = getattr(module, "LORA", False)
        try:
            run.progress = Progress(source=spec.source)
            weights = await fetch(spec.source, self._downloads(), run.progress)
            run.weights = Path(weights)
            if run.lora:
                for name, source in spec.adapters[: module.lora_slots(spec)]:
                    run.progress = Progress(source=source)
                    path = str(await fetch(source, self._downloads(), run.progress))
                    try:
                        run.adapters[name] = getattr(module, "lora_file", str)(path)
                    except CannotStart as exc:  # not one this engine loads: the replica serves the others
                        log.warning("shard %s: adapter %s left out: %s", spec.id, name, exc)
            run.port = free_port()
            extra: dict = {"adapters": dict(run.adapters)} if run.lora else {}
            if getattr(module, "RUN_DIR", False):
                extra["run_dir"] = self._run_dir(run)
            # In a thread: llama.cpp's reads the profile with its server's parser, whose import takes a while.
            cmd = await asyncio.to_thread(module.command, spec, str(weights), run.port, self.advertise_host, **extra)
        except (FetchError, CannotStart) as exc:
            self._fail(run, str(exc))
            return
        run.state, run.loading = "starting", time.monotonic()
        engine_env = getattr(module, "environment", _no_env)(spec, self.advertise_host, run.port)
        if not await self._start(run, cmd, engine_env):
            return
        if module.serves_api(spec):
            if not await self._probe(run, module.PROBE_PATHS):
                return
            run.endpoint = f"http://{self.advertise_host}:{run.port}"
        run.state, run.ready_at = "ready", time.monotonic()
        log.info("shard %s ready at %s", spec.id, run.endpoint or "(no API on this rank)")
        if run.lora and {n for n, _ in run.spec.adapters} != set(run.adapters):
            self._load_adapters_soon(run)  # the catalog's adapters changed while it started
        code = await run.proc.wait()
        self._fail(run, f"the engine exited with status {code}")

    def _run_dir(self, run: ShardRun) -> Path:
        """The shard's own directory, for files its engine reads (the id is safe as a name: ShardSpec checks)."""
        return self.work_dir / "shards" / run.spec.id

    def _downloads(self) -> Path:
        return download_dir(self.model_dirs, self.work_dir / "weights")

    def _load_adapters_soon(self, run: ShardRun) -> None:
        """Bring a ready engine's adapters in step with its spec, once at a time (the next beat may ask again)."""
        module = engine(run.spec.engine)
        if run.state != "ready" or not getattr(module, "RUNTIME_LORA", False) or run.endpoint is None:
            return
        if run.loader is None or run.loader.done():
            run.loader = asyncio.create_task(self._load_adapters(run, module), name=f"adapters:{run.spec.id}")

    async def _load_adapters(self, run: ShardRun, module) -> None:
        """Unload what the catalog dropped, then fetch and load what it added while the engine has room.

        vLLM's runtime adapter API (``/v1/load_lora_adapter``, ``/v1/unload_lora_adapter``; the engine runs
        with VLLM_ALLOW_RUNTIME_LORA_UPDATING). An adapter that fails to fetch or load is logged and tried
        again when the catalog next changes or the replica restarts; the others still load.
        """
        wanted = dict(run.spec.adapters)
        headers = {"Authorization": f"Bearer {run.spec.api_key}"} if run.spec.api_key else {}
        async with httpx.AsyncClient(timeout=60, headers=headers) as client:
            for name in [n for n in run.adapters if n not in wanted]:
                try:
                    answer = await client.post(f"{run.endpoint}/v1/unload_lora_adapter", json={"lora_name": name})
                except httpx.HTTPError as exc:
                    log.warning("shard %s: unloading adapter %s failed: %s", run.spec.id, name, exc)
                    continue
                if answer.status_code == 200:
                    run.adapters.pop(name, None)
            for name, source in wanted.items():
                if name in run.adapters or len(run.adapters) >= module.lora_slots(run.spec):
                    continue
                try:
                    path = str(await fetch(source, self._downloads(), Progress(source=source)))
                    answer = await client.post(
                        f"{run.endpoint}/v1/load_lora_adapter", json={"lora_name": name, "lora_path": path}
                    )
                except (FetchError, httpx.HTTPError) as exc:
                    log.warning("shard %s: adapter %s not loaded: %s", run.spec.id, name, exc)
                    continue
                if answer.status_code == 200:
                    run.adapters[name] = path
                else:
                    log.warning("shard %s: adapter %s not loaded: %s", run.spec.id, name, answer.text[:200])

    async def _start(self, run: ShardRun, cmd: list[str], engine_env: dict[str, str | None]) -> bool:
        logs = self.work_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        run.log_path = logs / f"{run.spec.id}.log"
        env = {**self.base_env, **run.spec.environment, **run.spec.distributed_env(), **engine_env}
        env = {k: v for k, v in env.items() if v is not None}
        shown = " ".join(cmd).replace(run.spec.api_key, REDACTED) if run.spec.api_key else " ".join(cmd)
        try:
            with run.log_path.open("ab") as out:
                out.write(f"llmgw: starting {shown}\n".encode())
                if not run.spec.api_key:
                    out.write(b"llmgw: the control plane gave no key: anyone who reaches this address is served\n")
                out.flush()
                run.proc = await asyncio.create_subprocess_exec(
                    *cmd, stdout=out, stderr=asyncio.subprocess.STDOUT, env=env, start_new_session=True
                )
        except OSError as exc:
            self._fail(run, f"cannot start {cmd[0]}: {exc.strerror or exc}")
            return False
        return True

    async def _probe(self, run: ShardRun, paths: Sequence[str]) -> bool:
        """Until the engine answers one of ``paths`` with 200; False when it exits or takes too long."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.start_timeout_s
        headers = {"Authorization": f"Bearer {run.spec.api_key}"} if run.spec.api_key else {}
        async with httpx.AsyncClient(timeout=5, headers=headers) as client:
            while loop.time() < deadline:
                if run.proc.returncode is not None:
                    self._fail(run, f"the engine exited with status {run.proc.returncode} while starting")
                    return False
                for path in paths:
                    with contextlib.suppress(httpx.HTTPError):
                        if (await client.get(f"http://{self.advertise_host}:{run.port}{path}")).status_code == 200:
                            return True
                await asyncio.sleep(PROBE_INTERVAL_S)
        self._fail(run, f"the engine did not answer within {self.start_timeout_s:.0f} s")
        await self._terminate(run)
        return False

    async def _stop(self, run: ShardRun) -> None:
        run.state = "stopping"
        if run.loader is not None:
            run.loader.cancel()
        if run.task is not None and not run.task.done() and (run.proc is None or run.proc.returncode is not None):
            run.task.cancel()  # still fetching: nothing to signal
        await self._terminate(run)
        if run.task is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await run.task
        shutil.rmtree(self._run_dir(run), ignore_errors=True)
        self.runs.pop(run.spec.id, None)

    async def _terminate(self, run: ShardRun) -> None:
        """SIGTERM to the engine's process group, SIGKILL after the stop timeout."""
        proc = run.proc
        if proc is None or proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), self.stop_timeout_s)
        except TimeoutError:
            log.warning("shard %s did not stop in %.0f s: killing it", run.spec.id, self.stop_timeout_s)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()


def _no_env(spec: ShardSpec, host: str, port: int) -> dict[str, str | None]:
    return {}


def source_paths(source: str, model_dirs: Sequence[Path], fallback: Path) -> list[Path]:
    """Where a source's weights are, or will be once fetched: a file:// path, an hf:// repository's cache folder."""
    if source.startswith("file://"):
        return [Path(unquote(urlparse(source).path))]
    if source.startswith("hf://"):
        repo = source.removeprefix("hf://").strip("/").split("@", 1)[0]
        if repo:
            return [download_dir(model_dirs, fallback) / "hf" / ("models--" + repo.replace("/", "--"))]
    return []
