"""How long the control plane takes to read a whole fabric's scan and draw its map.

Run from the checkout: ``python bench/fabrics.py [repeats]``. Prints the median
and spread, in milliseconds, of parsing the DGX SuperPOD capture (~300 KB, 40
switches, 582 adapters), of building its view, and of both together; and of
the analysis of a simulated 512-node fleet with eight ports each. Figures, not
a test: the page asks for the map on every open, so they should stay well
under 100 ms.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from inventory.fabrics import PortFacts, analyze
from inventory.ibnetdiscover import normalize_guid, parse
from inventory.topology import build_view
from tests.captures import read

CAPTURE = "ibnetdiscover_dgx-superpod_ndr_full-fabric.txt"


def timed(fn: Callable[[], object], repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        # A fresh process has an empty GUID cache; so does every run here.
        normalize_guid.cache_clear()
        start = time.perf_counter()
        fn()
        out.append((time.perf_counter() - start) * 1000)
    return out


def fleet(nodes: int = 512, ports: int = 8) -> list[PortFacts]:
    sms = ["0x248a0703005d1b01", "0x248a0703005d2c02"]
    return [
        PortFacts(
            node=f"gpu-{n:04}",
            hca=f"mlx5_{p}",
            port=1,
            state="4: ACTIVE",
            phys_state="5: LinkUp",
            rate_gbps=400.0,
            link_layer="InfiniBand",
            sm_lid=1,
            sm_guid=sms[n % 2],
            declared_fabric=("north", "south")[n % 2] if n != 7 else "north",  # one mislabelled
            counters={"symbol_error": 1 if n % 64 == 5 else 0, "port_xmit_data": 10**12},
            previous_counters={"symbol_error": 0, "port_xmit_data": 10**11},
        )
        for n in range(nodes)
        for p in range(ports)
    ]


def report(name: str, samples: list[float]) -> None:
    q = statistics.quantiles(samples, n=10)
    print(f"{name:<34} median {statistics.median(samples):7.2f} ms   p10 {q[0]:7.2f}   p90 {q[-1]:7.2f}")


def main() -> None:
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 30
    text = read(CAPTURE)
    fmap = parse(text)
    print(f"{CAPTURE}: {len(text) / 1024:.0f} KiB, {len(fmap.switches)} switches, {len(fmap.cas)} CAs, ", end="")
    print(f"{len(fmap.links)} links; {repeats} runs each")
    report("parse", timed(lambda: parse(text), repeats))
    report("build_view", timed(lambda: build_view(fmap, {}), repeats))
    report("parse + build_view", timed(lambda: build_view(parse(text), {}), repeats))
    ports = fleet()
    report(f"analyze ({len(ports)} ports, 512 nodes)", timed(lambda: analyze(ports, [], datetime.now(UTC)), repeats))


if __name__ == "__main__":
    main()
