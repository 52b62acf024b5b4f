"""Everything about a node except its GPUs, in one call for the report builder.

Each section is collected on its own: one that fails leaves its key out (unknown)
and adds a sentence to ``problems``, and the others still come out. Keys:

- ``imex``: see :mod:`agent.discovery.imex` for its ``state`` vocabulary. Present
  even when IMEX is not installed (``state: "not installed"``); absent only when
  it could not be looked at.
- ``ib_ports``: InfiniBand and RoCE ports, ``[]`` when the node has none.
- ``host``: host facts (:func:`agent.discovery.host.read_host`).
- ``load``: CPU, load averages and memory; ``cpu_percent`` only from the second
  report of a long-lived ``sampler`` on. Absent when nothing could be read.
- ``disks``: storage mounts with sizes, ``shared`` and the model dirs on each.
- ``engines``: engine → version; ``{}`` means looked for and none found.
- ``weights``: model weights found under the configured model dirs; absent when
  no model dir is configured (not looked for), ``[]`` when looked and none found.
- ``problems``: sentences for an operator, each prefixed by the section it is about.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agent.discovery import engines, host, imex, infiniband, weights
from agent.discovery.errors import DiscoveryError
from agent.discovery.host import LoadSampler
from agent.discovery.sources import Sources
from agent.discovery.tools import ToolOutput, run_tool

__all__ = ["LoadSampler", "collect_node"]

Run = Callable[[list[str]], ToolOutput]

_TITLES = {
    "imex": "IMEX",
    "ib_ports": "InfiniBand",
    "host": "host",
    "load": "load",
    "disks": "disks",
    "engines": "engines",
    "weights": "model weights",
}


def collect_node(sources: Sources, run: Run = run_tool, sampler: LoadSampler | None = None) -> dict:
    """The non-GPU part of the node report. Never raises for what it finds on the machine.

    Pass the same ``sampler`` on every report so CPU use can be measured between them.
    """
    sampler = sampler if sampler is not None else LoadSampler()
    report: dict = {}
    problems: list[str] = []
    sections: list[tuple[str, Callable[[], Any]]] = [
        ("imex", lambda: (imex.collect_imex(sources, run, lambda: host.local_ipv4_addresses(run)), [])),
        ("ib_ports", lambda: infiniband.collect_ib_ports(sources, run)),
        ("host", lambda: host.read_host(sources)),
        ("load", lambda: (sampler.sample(sources.proc_root) or None, [])),
        ("disks", lambda: (host.read_disks(sources), [])),
        ("engines", lambda: (engines.find_engines(run), [])),
    ]
    if sources.model_dirs:
        sections.append(("weights", lambda: weights.scan_weights(sources.model_dirs)))
    for key, collect in sections:
        value, found = _collect(key, collect)
        if value is not None:
            report[key] = value
        problems += [f"{_TITLES[key]}: {sentence}" for sentence in found]
    report["problems"] = problems
    return report


def _collect(key: str, collect: Callable[[], tuple[Any, list[str]]]) -> tuple[Any, list[str]]:
    """(value, problems) from one section; (None, [why]) when it failed."""
    try:
        return collect()
    except DiscoveryError as exc:
        return None, [str(exc)]
    except Exception as exc:  # noqa: BLE001 - see below
        # A bug in one reader, or an odd machine we did not foresee, must not cost the rest of the
        # report: the section is left out as unknown and the sentence says what happened.
        return None, [f"could not be collected ({type(exc).__name__}: {exc})"]
