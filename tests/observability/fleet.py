"""A simulated fleet in the inventory, through the real ingestion path, and a scrape of it parsed back.

The reports are the simulator's (agent.simulator.fleet: real captures with
per-node identities, and its faults), stored with inventory.writes.ingest.ingest_report
exactly as the agent endpoints store them.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from agent.simulator.fleet import SimNode, build_fleet
from inventory.models import Node
from inventory.writes.ingest import ingest_report
from observability.metrics import FleetCollector


def ingest_fleet(spec: str, now: datetime) -> dict[str, SimNode]:
    nodes = build_fleet(spec)
    for sim in nodes:
        ingest_report(Node.objects.create(name=sim.name, last_seen=now), sim.report(), now)
    return {n.name: n for n in nodes}


def report_again(sims: Iterable[SimNode], now: datetime) -> None:
    """Each node sends its full report again, after a fault changed it."""
    for sim in sims:
        ingest_report(Node.objects.get(name=sim.name), sim.report(), now)


class Scrape:
    """An exposition text parsed back with prometheus_client's own parser."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.families = {f.name: f for f in text_string_to_metric_families(text)}

    def samples(self, name: str, **labels: str) -> list:
        found = [s for f in self.families.values() for s in f.samples if s.name == name]
        assert found or name in self.families, f"no {name} in the scrape"
        return [s for s in found if all(s.labels.get(k) == v for k, v in labels.items())]

    def value(self, name: str, **labels: str) -> float:
        found = self.samples(name, **labels)
        assert len(found) == 1, f"{len(found)} samples of {name} with {labels}"
        return found[0].value

    def by(self, name: str, *keys: str) -> dict[tuple[str, ...], float]:
        return {tuple(s.labels[k] for k in keys): s.value for s in self.samples(name)}


def scrape_fleet(now: datetime) -> Scrape:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FleetCollector(now=lambda: now))
    return Scrape(generate_latest(registry).decode())
