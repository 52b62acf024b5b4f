"""Benchmark discovery over the 8-GPU H100 capture: the GPU part, the NVML path over the fake, the whole report.

Run: ``python bench/discover.py [N]``. Prints median and p95 in milliseconds
per build. The GPU part should stay well under 50 ms: the agent rebuilds the
report every minute and on every change.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agent.discovery import nvidia_smi as smi
from agent.discovery.nvml_fake import FakeNvml
from agent.discovery.report import build_report, collect_gpus
from agent.discovery.sources import Sources
from agent.discovery.tools import ToolOutput
from tests.captures import capture, read

XML = "nvidia-smi-q-x_h100-80gb-hbm3-x8_hgx_drv580.105.08_fabric-zero-uuid.xml"
TOPO = "nvidia-smi-topo-m_h100-x8_8nics-mlx5_sglang-issue.txt"


def no_tools(argv: list[str]) -> ToolOutput:
    return ToolOutput(error=f"{argv[0]} not found")


def topo_only(argv: list[str]) -> ToolOutput:
    if argv == ["nvidia-smi", "topo", "-m"]:
        return ToolOutput(stdout=read(TOPO), exit_code=0)
    return no_tools(argv)


def timed(label: str, fn, n: int) -> None:
    fn()  # warm up (imports, file cache)
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1000)
    samples.sort()
    p95 = samples[min(len(samples) - 1, round(0.95 * len(samples)) - 1)]
    print(f"{label:<52} n={n:<4} median {statistics.median(samples):7.2f} ms   p95 {p95:7.2f} ms")


def main(argv: list[str]) -> int:
    n = int(argv[0]) if argv else 200
    sources = Sources(nvidia_smi_xml=capture(XML), topo=capture(TOPO))
    log = smi.parse_xml(read(XML))
    print(f"capture: {XML} (8x H100) + {TOPO}")
    timed("GPU part from captures (read, parse, topo, entries)", lambda: collect_gpus(sources, run=no_tools), n)
    timed(
        "GPU part via NVML over FakeNvml (+ topo -m)",
        lambda: collect_gpus(Sources(sysfs_root=Path("/nonexistent")), nvml_api=FakeNvml(log), run=topo_only),
        n,
    )
    timed("whole report, GPU part only (node=False)", lambda: build_report(sources, run=no_tools, node=False), n)
    timed("whole report with node facts", lambda: build_report(sources, run=no_tools), max(10, n // 10))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
