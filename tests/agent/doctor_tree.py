"""A fake machine for ``llmgw doctor``: /proc, /dev, /etc and /sys trees under a temporary directory.

Every test runs doctor against one of these, so nothing of the machine running
the tests (its CPU, its IMEX, its disks) leaks into a verdict.
"""

from __future__ import annotations

import json
from pathlib import Path

from agent import doctor_cmd

# One mount, the root filesystem, as /proc/self/mountinfo writes it.
MOUNTINFO = "29 1 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw\n"


class Tree:
    def __init__(self, root: Path, *, arch: str = "x86_64", flags: str = "fpu sse sse2 avx avx2") -> None:
        self.root = root
        self.proc, self.dev, self.etc, self.sys = (root / n for n in ("proc", "dev", "etc", "sys"))
        (self.proc / "sys" / "kernel").mkdir(parents=True)
        (self.proc / "self").mkdir()
        for d in (self.dev, self.etc, self.sys):
            d.mkdir()
        (self.proc / "sys" / "kernel" / "arch").write_text(arch + "\n")
        (self.proc / "cpuinfo").write_text(f"processor\t: 0\nmodel name\t: Test CPU\nflags\t\t: {flags}\n\n")
        (self.proc / "self" / "mountinfo").write_text(MOUNTINFO)
        (self.sys / "bus" / "pci" / "devices").mkdir(parents=True)
        self.state = root / "state"

    def imex_channel(self, n: int = 0) -> None:
        channels = self.dev / "nvidia-caps-imex-channels"
        channels.mkdir(exist_ok=True)
        (channels / f"channel{n}").touch()

    def credential(self, server: str, node: str = "tray-01", secret: str = "llmgw_node_secret") -> None:
        self.state.mkdir(exist_ok=True)
        (self.state / "credential.json").write_text(json.dumps({"server": server, "node": node, "credential": secret}))

    def pci_gpu(self, slot: str = "0000:17:00.0", klass: str = "0x030200") -> None:
        device = self.sys / "bus" / "pci" / "devices" / slot
        device.mkdir()
        (device / "vendor").write_text("0x10de\n")
        (device / "class").write_text(klass + "\n")

    def args(self, *extra: str, offline: bool = True) -> list[str]:
        base = ["--proc-root", str(self.proc), "--dev-root", str(self.dev), "--etc-root", str(self.etc)]
        base += ["--sysfs-root", str(self.sys), "--state-dir", str(self.state), "--no-nvml"]
        return [*base, *(["--offline"] if offline else []), *extra]


def run_doctor(tree: Tree, capsys, *extra: str, offline: bool = True) -> tuple[int, dict[str, list[dict]]]:
    """Exit status and the checks by name (a check may have several rows)."""
    status = doctor_cmd.main(tree.args("--json", *extra, offline=offline))
    out = json.loads(capsys.readouterr().out)
    rows: dict[str, list[dict]] = {}
    for row in out["checks"]:
        rows.setdefault(row["check"], []).append(row)
    return status, rows


def verdict(rows: dict[str, list[dict]], check: str) -> str:
    """The worst status of a check's rows."""
    order = ["ok", "warn", "fail"]
    return max((r["status"] for r in rows[check]), key=order.index)


def seen(rows: dict[str, list[dict]], check: str) -> str:
    return " | ".join(r["seen"] for r in rows[check])
