"""A card's NVLink fabric as nvidia-smi and NVML report it: state, status, clique and cluster; and what it means.

The words are nvidia-smi's ("Completed", "Success"); NVML's numbers are put
in the same words (agent.discovery.nvml.fabric_from_nvml). Whether a card has
joined a domain is the shared rule of agent.nvlink_rules.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agent import nvlink_rules
from agent.discovery import nvidia_smi as smi


@dataclass
class FabricFacts:
    """The fabric registration of one card, in nvidia-smi's words (None = not reported)."""

    state: str | None = None  # Not Supported / Not Started / In Progress / Completed
    status: str | None = None  # "Success" or an NVML error string
    clique_id: int | None = None
    cluster_uuid: str | None = None
    summary: str | None = None  # Healthy / Unhealthy / Limited Capacity
    bandwidth: str | None = None  # Full / Degraded
    route_recovery: bool | None = None
    route_unhealthy: bool | None = None
    access_timeout_recovery: bool | None = None
    incorrect_configuration: str | None = None  # "None" when the configuration is correct
    partition_assigned: bool | None = None
    fabric_manager_connected: bool | None = None


FABRIC_STATES = {"not supported", "not started", "in progress", "completed"}


def _title(raw: str) -> str:
    return " ".join(w.capitalize() for w in raw.split())


def fabric_from_smi(raw: dict[str, str] | None) -> FabricFacts | None:
    """Fabric facts from nvidia-smi's flattened fabric block; None when the block is absent or the card is lost."""
    if raw is None:
        return None
    state = raw.get("state")
    if state is None or smi.is_lost(state):
        return None
    if state.strip().upper() == "N/A":
        return FabricFacts(state="Not Supported")
    if state.strip().lower() not in FABRIC_STATES:
        return None
    facts = FabricFacts(state=_title(state.strip()))
    if facts.state == "Completed":
        facts.status = _present(raw.get("status"))
        facts.clique_id = smi.integer(raw.get("clique_id"))
        uuid = raw.get("cluster_uuid")
        facts.cluster_uuid = uuid.strip().lower() if uuid and not smi.is_missing(uuid) else None
    summary = raw.get("summary")
    facts.summary = _title(summary) if summary and not smi.is_missing(summary) else None
    bandwidth = raw.get("bandwidth")
    facts.bandwidth = _title(bandwidth) if bandwidth and not smi.is_missing(bandwidth) else None
    facts.route_recovery = smi.yes_no(raw.get("route_recovery_in_progress"))
    facts.route_unhealthy = smi.yes_no(raw.get("route_unhealthy"))
    facts.access_timeout_recovery = smi.yes_no(raw.get("access_timeout_recovery"))
    facts.incorrect_configuration = _present(raw.get("incorrect_configuration"))
    facts.partition_assigned = smi.yes_no(raw.get("partition_assigned"))
    return facts


def _present(raw: str | None) -> str | None:
    """A raw string that is a value: not absent, empty, N/A or a read error ("None" is a value here)."""
    if raw is None or not raw.strip() or raw.strip().strip("[]").upper() == "N/A" or smi.is_lost(raw):
        return None
    return raw.strip()


def fabric_report(facts: FabricFacts) -> dict[str, Any]:
    """The report's ``fabric`` object: the facts, whether bandwidth is degraded, and problems in words."""
    out: dict[str, Any] = {"state": facts.state}
    if facts.status is not None:
        out["status"] = facts.status
    if facts.cluster_uuid is not None:
        out["cluster_uuid"] = facts.cluster_uuid
    if facts.clique_id is not None:
        out["clique_id"] = facts.clique_id
    if facts.summary is not None:
        out["health_summary"] = facts.summary
    if facts.bandwidth is not None:
        out["bandwidth"] = facts.bandwidth
        out["degraded"] = facts.bandwidth.lower() == "degraded"
    if facts.state != "Not Supported":
        out["problems"] = fabric_problems(facts)
    return out


def fabric_problems(facts: FabricFacts) -> list[str]:
    problems: list[str] = []
    if facts.state in ("Not Started", "In Progress"):
        problems.append(f"fabric registration {facts.state.lower()}")
    if facts.state == "Completed" and facts.status is not None and facts.status.lower() != "success":
        problems.append(f"fabric registration failed: {facts.status}")
    if facts.summary is not None and facts.summary.lower() != "healthy":
        problems.append(f"fabric health: {facts.summary}")
    if facts.bandwidth is not None and facts.bandwidth.lower() == "degraded":
        problems.append("fabric bandwidth degraded")
    if facts.route_recovery:
        problems.append("fabric route recovery in progress")
    if facts.route_unhealthy:
        problems.append("fabric route unhealthy")
    if facts.access_timeout_recovery:
        problems.append("fabric access timeout recovery in progress")
    incorrect = facts.incorrect_configuration
    if incorrect is not None and incorrect.lower() not in ("none", "false", "no"):
        problems.append(f"fabric configuration incorrect: {facts.incorrect_configuration}")
    if facts.partition_assigned is False:
        problems.append("no fabric partition assigned")
    if facts.fabric_manager_connected is False:
        problems.append("fabric manager disconnected")
    return problems


def joined_domain(fabric: dict[str, Any] | None) -> nvlink_rules.DomainKey | None:
    """The NVLink domain (cluster UUID, clique id) a card's fabric report says it has joined, or None.

    The control plane's rule (agent.nvlink_rules.joined_key), so what ``discover``
    and ``doctor`` say of a card is what ingestion and placement make of it.
    """
    if not fabric:
        return None
    return nvlink_rules.joined_key(
        fabric.get("state"), fabric.get("status"), fabric.get("cluster_uuid"), fabric.get("clique_id")
    )
