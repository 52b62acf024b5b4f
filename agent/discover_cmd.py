"""``llmgw discover``: what this machine is, as a readable summary or as the report's JSON.

Every ``--…`` capture option replaces the live source, so a capture taken
anywhere can be read on a laptop without a GPU, a driver or root. Exit status
0 when a report could be made (problems included), 1 with one line on stderr
when nothing given could be read at all.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, TextIO

from agent.discovery import fabric_facts
from agent.discovery.report import GpuSection, build_report, collect_gpus
from agent.discovery.sources import Sources


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="llmgw discover", description="Discover this machine's GPUs and node facts.")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    add_source_options(p)
    return p


def add_source_options(p: argparse.ArgumentParser) -> None:
    """The options that replace a live source by a capture; ``llmgw doctor`` takes the same."""
    p.add_argument("--nvidia-smi-xml", type=Path, metavar="FILE", help="read nvidia-smi -q -x from FILE")
    p.add_argument("--nvidia-smi-text", type=Path, metavar="FILE", help="read nvidia-smi -q from FILE")
    p.add_argument("--nvidia-smi-list", type=Path, metavar="FILE", help="read nvidia-smi -L from FILE")
    p.add_argument("--topo", type=Path, metavar="FILE", help="read nvidia-smi topo -m from FILE")
    p.add_argument("--imex-status", type=Path, metavar="FILE", help="read nvidia-imex-ctl -N from FILE")
    p.add_argument("--ibstat", type=Path, metavar="FILE", help="read ibstat (or ibstatus) from FILE")
    p.add_argument("--sysfs-root", type=Path, metavar="DIR", help="read sysfs under DIR instead of /sys")
    p.add_argument("--no-nvml", action="store_true", help="do not use NVML; use nvidia-smi")
    p.add_argument("--model-dir", type=Path, action="append", default=[], metavar="DIR", help="look for weights in DIR")


def sources_from_args(args: argparse.Namespace) -> Sources:
    extra: dict[str, Any] = {}
    if args.sysfs_root is not None:
        extra["sysfs_root"] = args.sysfs_root
    return Sources(
        nvidia_smi_xml=args.nvidia_smi_xml,
        nvidia_smi_text=args.nvidia_smi_text,
        nvidia_smi_list=args.nvidia_smi_list,
        topo=args.topo,
        imex_status=args.imex_status,
        ibstat=args.ibstat,
        use_nvml=not args.no_nvml,
        model_dirs=tuple(args.model_dir),
        **extra,
    )


def nothing_readable(sources: Sources, section: GpuSection) -> bool:
    """True when captures were given and none of them could be read: there is nothing to report on.

    With node captures (IMEX, ibstat) also given, their readers decide; we only
    fail when the GPU captures were all there was.
    """
    node_captures = sources.imex_status is not None or sources.ibstat is not None
    return bool(section.unreadable) and not section.read and not node_captures


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    sources = sources_from_args(args)
    section = collect_gpus(sources)
    if nothing_readable(sources, section):
        print(f"llmgw discover: {section.unreadable[0]}", file=sys.stderr)
        return 1
    report = build_report(sources, section=section)
    if args.json:
        json.dump(report, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print_summary(report, sys.stdout)
    return 0


# ---------------------------------------------------------------------------
# the readable summary


def _fabric_cell(entry: dict[str, Any]) -> str:
    fabric = entry.get("fabric")
    if fabric is None:
        return "?"
    state = fabric.get("state", "?")
    domain = fabric_facts.joined_domain(fabric)
    if domain is not None:
        text = f"{domain[0]}/{domain[1]}"
        return text + (" (degraded)" if fabric.get("degraded") else "")
    if state == "Completed" and fabric.get("status", "").lower() == "success":
        return "local NVSwitch"
    return state if state != "Completed" else f"{state}: {fabric.get('status', '?')}"


def _health_cell(entry: dict[str, Any]) -> str:
    problems = list(entry.get("health", [])) + list(entry.get("fabric", {}).get("problems", []))
    return "ok" if not problems else "; ".join(problems)


def _value(v: Any) -> str:
    return "?" if v is None else str(v)


def print_summary(report: dict[str, Any], out: TextIO) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(file=out, width=160, highlight=False, soft_wrap=False)
    head = f"GPUs from {report.get('gpu_source')}"
    if report.get("driver_version"):
        head += f" · driver {report['driver_version']}"
    if report.get("cuda_version"):
        head += f" · CUDA {report['cuda_version']}"
    gpus = report.get("gpus", [])
    if gpus:
        table = Table(title=head, title_justify="left")
        for column in ("GPU", "class", "memory", "NUMA", "fabric", "health"):
            table.add_column(column)
        for entry in gpus:
            memory = entry.get("memory_mb")
            table.add_row(
                entry.get("label", str(entry.get("index"))),
                _value(entry.get("class")),
                "?" if memory is None else f"{memory} MiB",
                _value(entry.get("numa")),
                _fabric_cell(entry) if "parent" not in entry else "-",
                _health_cell(entry),
            )
        console.print(table)
    else:
        console.print(f"{head}: no GPUs (a CPU node)")
    node = {k: v for k, v in report.items() if k not in _GPU_KEYS}
    if node:
        table = Table(title="Node", title_justify="left")
        table.add_column("fact")
        table.add_column("value", overflow="fold")
        for key, value in node.items():
            table.add_row(key, _short(value))
        console.print(table)
    problems = report.get("problems", [])
    if problems:
        console.print("Problems:")
        for problem in problems:
            console.print(f"  - {problem}")
    else:
        console.print("No problems.")


_GPU_KEYS = {
    "schema",
    "agent_version",
    "collected_at",
    "driver_version",
    "cuda_version",
    "gpu_source",
    "gpus",
    "problems",
}


def _short(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 300 else text[:297] + "..."
