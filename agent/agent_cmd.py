"""``llmgw agent``: the daemon on every node.

Settings come from flags, else the environment (``LLMGW_SERVER``,
``LLMGW_JOIN_TOKEN``, ``LLMGW_AGENT_NAME``, ``LLMGW_AGENT_STATE_DIR``), else a
YAML config file (``--config``, default ``/etc/llmgw/agent.yaml`` when it
exists). The join token is needed once: the credential it buys is kept in the
state dir (mode 0600) and used from then on, so the same machine restarting
keeps its identity.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import socket
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from agent.client import ControlPlane, Registration
from agent.collect import collect
from agent.discovery import xids
from agent.discovery.host import LoadSampler
from agent.discovery.sources import Sources
from agent.loop import AgentLoop, Identity
from agent.scan import run_scan
from agent.supervisor.prefetch import Prefetcher
from agent.supervisor.supervisor import Supervisor

log = logging.getLogger("llmgw.agent")
DEFAULT_CONFIG = Path("/etc/llmgw/agent.yaml")
CREDENTIAL_FILE = "credential.json"


@dataclass
class AgentSettings:
    server: str
    join_token: str | None
    name: str
    state_dir: Path
    model_dirs: list[Path] = field(default_factory=list)
    fabrics: dict[str, list[str]] | None = None
    use_nvml: bool = True
    advertise_host: str = ""
    stop_timeout_s: float = 30.0


class SettingsError(Exception):
    """A setting that is missing or unusable, in one sentence."""


def default_state_dir() -> Path:
    if os.geteuid() == 0:
        return Path("/var/lib/llmgw-agent")
    return Path(os.environ.get("XDG_STATE_HOME", Path.home() / ".local" / "state")) / "llmgw-agent"


def read_config(path: Path | None) -> dict[str, Any]:
    if path is None:
        path = DEFAULT_CONFIG if DEFAULT_CONFIG.exists() else None
    if path is None:
        return {}
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except OSError as exc:
        raise SettingsError(f"cannot read {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise SettingsError(f"{path} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise SettingsError(f"{path} must hold a mapping of settings")
    return data


def settings_from(args: argparse.Namespace, env: dict[str, str]) -> AgentSettings:
    config = read_config(args.config)

    def pick(flag, env_name, key, default=None):
        return flag or env.get(env_name) or config.get(key) or default

    server = pick(args.server, "LLMGW_SERVER", "server")
    if not server:
        raise SettingsError("no control plane given: --server URL, LLMGW_SERVER or 'server:' in the config file")
    if not str(server).startswith(("http://", "https://")):
        raise SettingsError(f"server {server!r} must be an http:// or https:// URL")
    fabrics = config.get("fabrics")
    if fabrics is not None and not (
        isinstance(fabrics, dict)
        and all(isinstance(v, list) and all(isinstance(h, str) for h in v) for v in fabrics.values())
    ):
        raise SettingsError("'fabrics:' in the config file must map each fabric name to a list of adapters")
    return AgentSettings(
        server=str(server),
        join_token=pick(args.join_token, "LLMGW_JOIN_TOKEN", "join_token"),
        name=str(pick(args.name, "LLMGW_AGENT_NAME", "name", socket.gethostname().split(".")[0])),
        state_dir=Path(pick(args.state_dir, "LLMGW_AGENT_STATE_DIR", "state_dir", default_state_dir())),
        model_dirs=[Path(p) for p in (args.model_dir or config.get("model_dirs") or [])],
        fabrics=fabrics,
        use_nvml=not args.no_nvml,
        advertise_host=str(pick(args.advertise_host, "LLMGW_AGENT_ADDRESS", "address", socket.gethostname())),
        stop_timeout_s=float(pick(args.stop_timeout, "LLMGW_AGENT_STOP_TIMEOUT_S", "stop_timeout_s", 30.0)),
    )


def machine_id(etc: Path = Path("/etc")) -> str:
    for path in (etc / "machine-id", Path("/var/lib/dbus/machine-id")):
        try:
            value = path.read_text().strip()
        except OSError:
            continue
        if value:
            return value[:64]
    return ""


def load_credential(state_dir: Path, server: str, name: str) -> str | None:
    """The kept credential, if it was issued by this server for this name."""
    try:
        saved = json.loads((state_dir / CREDENTIAL_FILE).read_text())
    except (OSError, ValueError):
        return None
    if saved.get("server") == server and saved.get("node") == name:
        return saved.get("credential")
    return None


def save_credential(state_dir: Path, server: str, registration: Registration) -> None:
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = state_dir / CREDENTIAL_FILE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump({"server": server, "node": registration.node, "credential": registration.credential}, fh)


class Discovery:
    """The real machine, as discovery sees it, with CPU use measured between reports."""

    def __init__(self, settings: AgentSettings) -> None:
        self.sources = Sources(use_nvml=settings.use_nvml, model_dirs=tuple(settings.model_dirs))
        self.fabrics = settings.fabrics
        self.address = settings.advertise_host
        self.sampler = LoadSampler()
        self.xids: xids.RecentXids | None = None

    def watch_xids(self, on_xid) -> threading.Event:
        """Read Xids as they happen (NVML events, else /dev/kmsg); ``on_xid`` asks for a report. Set to stop."""
        self.xids, stop = xids.start(use_nvml=self.sources.use_nvml, on_xid=on_xid)
        return stop

    async def report(self) -> dict:
        from agent.discovery.report import build_report

        report = await asyncio.to_thread(build_report, self.sources, sampler=self.sampler)
        if self.xids is not None:
            self.xids.attach(report.get("gpus", []))
            if self.xids.problem:
                report.setdefault("problems", []).append(self.xids.problem)
        if self.fabrics is not None:
            report["fabrics"] = self.fabrics
        # The control plane takes an engine's endpoint only at this address.
        report["address"] = self.address
        return report

    async def heartbeat(self) -> dict:
        load = await asyncio.to_thread(self.sampler.sample, self.sources.proc_root)
        return {"load": load} if load else {}


def shard_supervisor(settings: AgentSettings) -> Supervisor:
    """Engines run from the state dir (their logs, downloads when no model dir is given)."""
    return Supervisor(
        work_dir=settings.state_dir / "shards",
        model_dirs=settings.model_dirs,
        advertise_host=settings.advertise_host,
        stop_timeout_s=settings.stop_timeout_s,
    )


async def run_agent(settings: AgentSettings, stop: asyncio.Event) -> int:
    credential = load_credential(settings.state_dir, settings.server, settings.name)
    if credential is None and not settings.join_token:
        print("llmgw agent: not registered yet: give --join-token (or LLMGW_JOIN_TOKEN) once", file=sys.stderr)
        return 2
    discovery = Discovery(settings)
    supervisor = shard_supervisor(settings)
    plane = ControlPlane(settings.server)
    loop: AgentLoop | None = None
    # A finished prefetch changed what is on disk: the next report says so, and placement sees it.
    prefetcher = Prefetcher(
        model_dirs=settings.model_dirs,
        fallback=settings.state_dir / "shards" / "weights",
        on_done=lambda: loop.request_report() if loop else None,
    )

    async def heartbeat() -> dict:
        beat = {**await discovery.heartbeat(), "shards": supervisor.status()}
        if prefetcher.runs:
            beat["prefetch"] = prefetcher.status()
        return beat

    def in_use() -> list:
        return [*supervisor.weights_in_use(), *prefetcher.in_use()]

    loop = AgentLoop(
        plane,
        Identity(settings.name, machine_id(), credential),
        settings.join_token,
        make_report=discovery.report,
        make_heartbeat=heartbeat,
        on_registered=lambda reg: save_credential(settings.state_dir, settings.server, reg),
        on_shards=supervisor.apply,
        on_scan=run_scan,
        # The shards' weights are asked for again right before each deletion.
        on_collect=lambda paths: asyncio.to_thread(collect, paths, settings.model_dirs, in_use),
        on_prefetch=prefetcher.apply,
    )
    xids_stop = discovery.watch_xids(loop.request_report)
    try:
        await loop.run(stop)
    finally:
        xids_stop.set()
        # Engines are children of this agent: they stop with it, gracefully.
        await prefetcher.close()
        await supervisor.close()
        await plane.close()
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="llmgw agent", description="Report this node and run what it is told to.")
    p.add_argument("--server", help="the control plane's admin URL, e.g. https://llmgw.example:8000")
    p.add_argument("--join-token", help="the join token, needed for the first registration only")
    p.add_argument("--name", help="this node's name (default: the short hostname)")
    p.add_argument("--state-dir", type=Path, help="where the credential is kept")
    p.add_argument("--config", type=Path, help=f"YAML settings (default {DEFAULT_CONFIG} if present)")
    p.add_argument("--model-dir", type=Path, action="append", help="a directory holding model weights")
    p.add_argument("--no-nvml", action="store_true", help="read GPUs with nvidia-smi instead of NVML")
    p.add_argument("--advertise-host", help="the address clients reach this node's engines at (default: hostname)")
    p.add_argument("--stop-timeout", type=float, help="seconds an engine gets after SIGTERM before SIGKILL")
    return p


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        settings = settings_from(parser().parse_args(argv), dict(os.environ))
    except SettingsError as exc:
        print(f"llmgw agent: {exc}", file=sys.stderr)
        return 2

    async def main_async() -> int:
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            asyncio.get_running_loop().add_signal_handler(sig, stop.set)
        return await run_agent(settings, stop)

    return asyncio.run(main_async())
