"""``llmgw doctor``: can this node be trusted with work? A table of checks, or ``--json`` for scripts.

How it runs:

1. Settings as the agent reads them (``--config``, default
   /etc/llmgw/agent.yaml when present): the model dirs, the state dir that
   holds the credential, the server.
2. Discovery, exactly as ``llmgw discover`` does it; each of its ``--…``
   capture options replaces a live source, and ``--proc-root``,
   ``--dev-root``, ``--etc-root`` point the readers at a copied tree.
3. The facts discovery does not gather: NVIDIA devices on the PCI bus (to
   tell "no driver" from "a CPU node"), whether the model dirs exist, and a
   heartbeat ``{}`` to the control plane with this node's credential
   (skipped with ``--offline``).
4. The verdicts (agent.doctor.checks), printed; exit status 1 when any check
   failed, 0 otherwise (warnings included).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any, TextIO

from agent.agent_cmd import SettingsError, default_state_dir, read_config
from agent.discover_cmd import add_source_options, sources_from_args
from agent.discovery.report import build_report
from agent.discovery.sources import Sources
from agent.discovery.tools import run_tool
from agent.doctor import probe
from agent.doctor.checks import FAIL, OK, WARN, Check, Facts, run_checks, worst

STYLE = {OK: "green", WARN: "yellow", FAIL: "bold red"}
# How tools are run; a test puts a fake machine's tools here.
RUN = run_tool


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="llmgw doctor", description="Check that this node can be trusted with work.")
    p.add_argument("--json", action="store_true", help="print the checks as JSON")
    add_source_options(p)
    p.add_argument("--proc-root", type=Path, metavar="DIR", help="read /proc under DIR")
    p.add_argument("--dev-root", type=Path, metavar="DIR", help="read /dev under DIR (IMEX channels)")
    p.add_argument("--etc-root", type=Path, metavar="DIR", help="read /etc under DIR (IMEX config, os-release)")
    p.add_argument("--kernel-log", type=Path, metavar="FILE", help="read Xid errors from FILE instead of dmesg")
    p.add_argument("--config", type=Path, help="the agent's YAML settings (default /etc/llmgw/agent.yaml if present)")
    p.add_argument("--state-dir", type=Path, help="where the agent keeps its credential")
    p.add_argument("--server", help="the control plane's URL, instead of the one the credential names")
    p.add_argument("--offline", action="store_true", help="do not call the control plane")
    return p


def sources(args: argparse.Namespace, config: dict[str, Any]) -> Sources:
    base = sources_from_args(args)
    roots = {
        k: v
        for k, v in (("proc_root", args.proc_root), ("dev_root", args.dev_root), ("etc_root", args.etc_root))
        if v is not None
    }
    dirs = tuple(args.model_dir) or tuple(Path(d) for d in config.get("model_dirs") or [])
    return dataclasses.replace(base, model_dirs=dirs, **roots)


def kernel_log(args: argparse.Namespace, src: Sources) -> str | None:
    """The capture given, else dmesg on a live machine (it may need root: unreadable means Xids unchecked)."""
    if args.kernel_log is not None:
        return args.kernel_log.read_text(errors="replace")
    if src.replaying_gpus:
        return None  # a live kernel log says nothing about a captured machine's cards
    return RUN(["dmesg"]).stdout


def gather(args: argparse.Namespace, config: dict[str, Any]) -> tuple[dict[str, Any], Facts]:
    src = sources(args, config)
    report = build_report(src, run=RUN, kernel_log=kernel_log(args, src))
    real, missing = probe.model_dirs(src.model_dirs)
    reach = None
    if not args.offline:
        state_dir = args.state_dir or Path(config.get("state_dir") or default_state_dir())
        reach = probe.reach_control_plane(state_dir, args.server or None)
    facts = Facts(
        use_nvml=src.use_nvml,
        nvidia_pci_devices=None if src.replaying_gpus else probe.nvidia_pci_devices(src.sysfs_root),
        model_dirs=real,
        missing_model_dirs=missing,
        reach=reach,
    )
    return report, facts


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    try:
        config = read_config(args.config)
    except SettingsError as exc:
        print(f"llmgw doctor: {exc}", file=sys.stderr)
        return 2
    report, facts = gather(args, config)
    checks = run_checks(report, facts)
    if args.json:
        json.dump({"status": worst(checks), "checks": [c.as_json() for c in checks]}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print_table(checks, sys.stdout)
    return 1 if worst(checks) == FAIL else 0


def print_table(checks: list[Check], out: TextIO) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(file=out, width=160, highlight=False, soft_wrap=False)
    table = Table(title="llmgw doctor", title_justify="left")
    for column in ("check", "status", "seen", "what to do"):
        table.add_column(column, overflow="fold")
    for c in checks:
        table.add_row(c.check, f"[{STYLE[c.status]}]{c.status}[/]", c.seen, c.todo)
    console.print(table)
    failed = sum(c.status == FAIL for c in checks)
    warned = sum(c.status == WARN for c in checks)
    console.print(f"{failed} failed, {warned} warnings" + ("" if failed else ": this node can be trusted with work"))
