"""Running a simulated fleet: one AgentLoop per node, all in one event loop.

One HTTP connection pool serves every simulated node, bounded so that two
thousand agents do not open two thousand sockets at once. Start-up is
staggered across the heartbeat interval, as a real fleet's restarts are.
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import httpx

from agent import protocol
from agent.client import ControlPlane
from agent.loop import AgentLoop, Identity
from agent.simulator import fleet as F
from agent.simulator.bounded import BoundedTransport
from agent.simulator.engine import SimShards


@dataclass
class Running:
    node: F.SimNode
    loop: AgentLoop
    stop: asyncio.Event
    task: asyncio.Task | None = None


class Simulation:
    """A simulated fleet talking to one control plane."""

    def __init__(
        self,
        server: str,
        join_token: str,
        nodes: Iterable[F.SimNode],
        *,
        heartbeat_interval_s: float | None = None,
        report_interval_s: float | None = None,
        max_connections: int = 64,
        stagger_s: float | None = None,
        seed: int = 0,
        observe: Callable[[str, float, int], None] | None = None,
        run_shards: bool = True,
    ) -> None:
        self.server = server
        self.join_token = join_token
        self.nodes = {n.name: n for n in nodes}
        self.heartbeat_interval_s = heartbeat_interval_s
        self.report_interval_s = report_interval_s
        self.stagger_s = stagger_s
        self.observe = observe
        self.rng = random.Random(seed)
        limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        # The pool is handed only as many requests as it has connections (agent.simulator.bounded).
        self.client = httpx.AsyncClient(
            timeout=30, transport=BoundedTransport(httpx.AsyncHTTPTransport(limits=limits), max_connections)
        )
        self.running: dict[str, Running] = {}
        # Nodes cut off by a partition fault: alive, their engines running, but silent until it heals.
        self.cut_off: set[str] = set()
        self.credentials: dict[str, str] = {}
        self.timers: set[asyncio.Task] = set()
        # Each simulated node's shards, served by fake engines; kept across a node's restarts
        # the way a real node's engines outlive a heartbeat hiccup.
        self.shards: dict[str, SimShards] = {n: SimShards() for n in self.nodes}
        # False: the nodes run nothing and say nothing about shards, for tests that
        # place replicas by hand and want them left as they put them.
        self.run_shards = run_shards

    # --- life of the fleet ---

    def _loop_for(self, node: F.SimNode) -> AgentLoop:
        plane = ControlPlane(self.server, self.client, observe=self.observe)

        async def report() -> dict:
            return node.report()

        shards = self.shards.setdefault(node.name, SimShards())

        async def heartbeat() -> dict:
            load = {"cpu_percent": round(self.rng.uniform(1, 40), 1), "load1": 1.0}
            return {"load": load, "shards": shards.status()} if self.run_shards else {"load": load}

        def registered(registration) -> None:
            self.credentials[node.name] = registration.credential

        async def scan(request: dict) -> dict:
            # Every simulated fabric is mapped by the same real capture: what a scan of it would return.
            return {"output": F.scan_capture(), "took_ms": 1}

        loop = AgentLoop(
            plane,
            Identity(node.name, F._uuid("machine", node.name), self.credentials.get(node.name)),
            self.join_token,
            report,
            heartbeat,
            on_registered=registered,
            on_shards=shards.apply if self.run_shards else None,
            on_scan=scan,
            rng=self.rng,
        )
        if self.heartbeat_interval_s is not None:
            loop.heartbeat_interval_s = self.heartbeat_interval_s
            loop.intervals_fixed = True
        if self.report_interval_s is not None:
            loop.report_interval_s = self.report_interval_s
            loop.intervals_fixed = True

        return loop

    async def _run_node(self, running: Running, delay: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(running.stop.wait(), timeout=delay)
        if not running.stop.is_set():
            await running.loop.run(running.stop)

    def _start(self, node: F.SimNode, delay: float) -> None:
        node.alive = True
        running = Running(node, self._loop_for(node), asyncio.Event())
        running.task = asyncio.create_task(self._run_node(running, delay), name=f"sim:{node.name}")
        self.running[node.name] = running

    async def start(self) -> None:
        spread = self.stagger_s
        if spread is None:
            spread = min(self.heartbeat_interval_s or protocol.HEARTBEAT_INTERVAL_S, len(self.nodes) * 0.005)
        for node in self.nodes.values():
            self._start(node, self.rng.uniform(0, spread))

    async def wait_registered(self, timeout: float = 60.0) -> None:
        async def all_in() -> None:
            while len(self.credentials) < len(self.nodes):
                await asyncio.sleep(0.05)

        await asyncio.wait_for(all_in(), timeout)

    async def stop(self) -> None:
        for task in self.timers:
            task.cancel()
        for running in self.running.values():
            running.stop.set()
        tasks = [r.task for r in self.running.values() if r.task]
        await asyncio.gather(*tasks, return_exceptions=True)
        self.running.clear()
        for shards in self.shards.values():
            await shards.close()
        await self.client.aclose()

    # --- faults ---

    def node(self, name: str) -> F.SimNode:
        try:
            return self.nodes[name]
        except KeyError:
            raise F.FaultError(f"no simulated node named {name!r}") from None

    def rack(self, rack: str) -> list[F.SimNode]:
        trays = [n for n in self.nodes.values() if n.rack == rack]
        if not trays:
            raise F.FaultError(f"no simulated rack named {rack!r}")
        return trays

    def _changed(self, *nodes: F.SimNode) -> None:
        for node in nodes:
            running = self.running.get(node.name)
            if running:
                running.loop.request_report()
                running.stop.set()  # wake it now; restarted at once below
                self._restart_soon(running)

    def _restart_soon(self, running: Running) -> None:
        async def again() -> None:
            if running.task:
                await running.task
            if running.node.alive and self.running.get(running.node.name) is running:
                running.stop = asyncio.Event()
                running.task = asyncio.create_task(running.loop.run(running.stop), name=f"sim:{running.node.name}")

        self._timer(again())

    def _timer(self, coro) -> None:
        task = asyncio.create_task(coro)
        self.timers.add(task)
        task.add_done_callback(self.timers.discard)

    def kill(self, name: str) -> None:
        """The node dies: no more heartbeats until revive(), and its engines die with it."""
        node = self.node(name)
        node.alive = False
        running = self.running.pop(name, None)
        if running:
            running.stop.set()
        self.shards[name].apply([])

    def revive(self, name: str) -> None:
        node = self.node(name)
        self.cut_off.discard(name)
        if name not in self.running:
            self._start(node, 0.0)

    def tray_leave(self, name: str) -> None:
        node = self.node(name)
        F.tray_leave(node)
        self._changed(node)

    def tray_rejoin(self, name: str) -> None:
        node = self.node(name)
        F.tray_rejoin(node)
        self._changed(node)

    def fm_restart(self, rack: str, seconds: float = 10.0) -> None:
        """A fabric manager restart: every card of the rack leaves, then rejoins after ``seconds``."""
        trays = self.rack(rack)
        for tray in trays:
            F.tray_leave(tray)
        self._changed(*trays)

        async def rejoin() -> None:
            await asyncio.sleep(seconds)
            for tray in trays:
                F.tray_rejoin(tray)
            self._changed(*trays)

        self._timer(rejoin())

    def partition(self, pattern: str, seconds: float) -> list[str]:
        """The network to the nodes matching ``pattern`` (a glob, ``hgx-00*``) is cut for ``seconds``.

        Unlike ``kill``, the machines keep running and so do their engines: they
        only stop reaching the control plane, as behind a rebooting rack switch,
        and beat again (with the same credential) once it heals. The names cut off.
        """
        matched = sorted(name for name in self.nodes if fnmatch.fnmatchcase(name, pattern))
        if not matched:
            raise F.FaultError(f"no simulated node matches {pattern!r}")
        cut = []
        for name in matched:
            running = self.running.pop(name, None)
            if running is not None:
                running.stop.set()
                cut.append(name)
        self.cut_off.update(cut)

        async def heal() -> None:
            await asyncio.sleep(seconds)
            for name in cut:
                self.cut_off.discard(name)
                node = self.nodes[name]
                if node.alive and name not in self.running:
                    self._start(node, 0.0)

        self._timer(heal())
        return cut

    def imex_down(self, name: str) -> None:
        node = self.node(name)
        F.imex_down(node)
        self._changed(node)

    def imex_up(self, name: str) -> None:
        node = self.node(name)
        F.imex_up(node)
        self._changed(node)

    def degrade(self, name: str, gpu: int = 0) -> None:
        node = self.node(name)
        F.degrade(node, gpu)
        self._changed(node)

    def mislabel(self, name: str, fabric: str) -> None:
        node = self.node(name)
        F.mislabel(node, fabric)
        self._changed(node)

    def gpu_lost(self, name: str, gpu: int = 0) -> None:

        node = self.node(name)
        F.gpu_lost(node, gpu)
        self._changed(node)

    def xid(self, name: str, gpu: int, code: int) -> None:
        node = self.node(name)
        F.xid(node, gpu, code)
        self._changed(node)

    def ecc(self, name: str, gpu: int) -> None:
        node = self.node(name)
        F.ecc(node, gpu)
        self._changed(node)

    def apply(self, command: str) -> str:
        """A fault written as text: ``tray-leave NODE``, ``fm-restart RACK [SECONDS]``, ``xid NODE GPU CODE``,
        ``partition NODE-PATTERN SECONDS``…"""
        words = command.split()
        if not words:
            return ""
        verb, args = words[0].replace("_", "-"), words[1:]
        actions = {
            "kill": (self.kill, 1),
            "revive": (self.revive, 1),
            "tray-leave": (self.tray_leave, 1),
            "tray-rejoin": (self.tray_rejoin, 1),
            "imex-down": (self.imex_down, 1),
            "imex-up": (self.imex_up, 1),
            "fm-restart": (self.fm_restart, 2),
            "degrade": (self.degrade, 2),
            "gpu-lost": (self.gpu_lost, 2),
            "mislabel": (self.mislabel, 2),
            "xid": (self.xid, 3),
            "ecc": (self.ecc, 2),
            "partition": (self.partition, 2),
        }
        if verb not in actions:
            raise F.FaultError(f"unknown fault {verb!r}; one of {', '.join(sorted(actions))}")
        action, most = actions[verb]
        least = {"xid": 3, "partition": 2}.get(verb, 1)
        if not least <= len(args) <= most:
            raise F.FaultError(
                f"{verb} takes {_ARGUMENTS.get(verb) or ('a target' if most == 1 else 'a target and a number')}"
            )
        if verb == "mislabel":
            converted = list(args)
        else:
            seconds = verb in ("fm-restart", "partition")
            converted = [args[0], *(float(a) if seconds else int(a) for a in args[1:])]

        action(*converted)
        return f"{verb} {' '.join(args)}: done"


_ARGUMENTS = {
    "xid": "a node, a GPU and an Xid code (xid NODE GPU CODE)",
    "ecc": "a node and a GPU (ecc NODE GPU)",
    "partition": "a node pattern and a number of seconds (partition NODE-PATTERN SECONDS)",
}
