"""``llmgw simulate``: a fleet of simulated agents against a running control plane.

Faults can be given on the command line (``--fault "tray-leave nvl72-00-tray-03"``,
applied once the fleet has registered, or ``--fault "fm-restart nvl72-00 20@30"``
to apply it 30 s later) and typed on standard input while it runs, one per
line. Ctrl-C stops it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys

from agent.simulator import fleet as F
from agent.simulator.runner import Simulation

STATUS_EVERY_S = 10.0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="llmgw simulate", description="Run simulated agents built from real captures.")
    p.add_argument("--server", default=os.environ.get("LLMGW_SERVER"), help="the control plane's admin URL")
    p.add_argument("--join-token", default=os.environ.get("LLMGW_JOIN_TOKEN"), help="the agent join token")
    p.add_argument("--fleet", required=True, help="e.g. gb200-nvl72:2,h100-hgx:8,a100-mig:2,cpu:2")
    p.add_argument("--prefix", default="", help="prefix for node names, to run several fleets against one server")
    p.add_argument("--heartbeat", type=float, help="seconds between light heartbeats (default: what the server says)")
    p.add_argument("--report", type=float, help="seconds between full reports (default: what the server says)")
    p.add_argument("--fault", action="append", default=[], help="a fault to apply, e.g. 'imex-down hgx-000'")
    p.add_argument("--connections", type=int, default=64, help="HTTP connections shared by all simulated nodes")
    return p


def split_delay(text: str) -> tuple[str, float]:
    command, _, after = text.partition("@")
    try:
        return command.strip(), float(after) if after else 0.0
    except ValueError:
        raise F.FaultError(f"{text!r}: the delay after '@' must be a number of seconds") from None


async def read_commands(sim: Simulation, stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line:
            return
        try:
            print(sim.apply(line.strip()), flush=True)
        except (F.FaultError, ValueError) as exc:
            print(f"llmgw simulate: {exc}", file=sys.stderr, flush=True)


async def status(sim: Simulation, stop: asyncio.Event) -> None:
    while not stop.is_set():
        alive = sum(1 for n in sim.nodes.values() if n.alive)
        failing = sum(1 for r in sim.running.values() if r.loop.state.failures)
        print(
            f"llmgw simulate: {len(sim.credentials)}/{len(sim.nodes)} registered, {alive} alive, {failing} retrying",
            flush=True,
        )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), STATUS_EVERY_S)


async def run(args: argparse.Namespace, nodes: list[F.SimNode], faults: list[tuple[str, float]]) -> int:
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    sim = Simulation(
        args.server,
        args.join_token,
        nodes,
        heartbeat_interval_s=args.heartbeat,
        report_interval_s=args.report,
        max_connections=args.connections,
    )
    await sim.start()
    helpers = [asyncio.create_task(status(sim, stop))]
    if not sys.stdin.isatty() or sys.stdin.readable():
        helpers.append(asyncio.create_task(read_commands(sim, stop)))

    async def later(command: str, delay: float) -> None:
        await asyncio.sleep(delay)
        try:
            print(sim.apply(command), flush=True)
        except F.FaultError as exc:
            print(f"llmgw simulate: {exc}", file=sys.stderr, flush=True)

    for command, delay in faults:
        helpers.append(asyncio.create_task(later(command, delay)))
    await stop.wait()
    for task in helpers:
        task.cancel()
    await sim.stop()
    return 0


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    if not args.server or not args.join_token:
        print("llmgw simulate: give --server and --join-token (or LLMGW_SERVER and LLMGW_JOIN_TOKEN)", file=sys.stderr)
        return 2
    try:
        nodes = F.build_fleet(args.fleet, prefix=args.prefix)
        faults = [split_delay(text) for text in args.fault]
    except (F.SpecError, F.FaultError) as exc:
        print(f"llmgw simulate: {exc}", file=sys.stderr)
        return 2
    print(f"llmgw simulate: {len(nodes)} nodes, {sum(len(n.gpus) for n in nodes)} GPUs → {args.server}", flush=True)
    return asyncio.run(run(args, nodes, faults))
