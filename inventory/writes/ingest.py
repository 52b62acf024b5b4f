"""Ingestion: a node's report becomes inventory rows, writing only what changed.

Steps for a full report, all in one transaction:

1. Compare the report's digest (volatile readings and traffic counters left
   out; error counters kept, see agent.protocol) with the one stored at the
   last report. Equal: only liveness and load are written.
2. Otherwise map node-level facts onto the node's columns and write those
   that differ. A key the report lacks becomes NULL — unknown — never empty.
3. Diff GPUs by index and IB ports by (HCA, port): create, update only the
   changed columns, delete what is gone. NVLink domains are created the first
   time a card reports one and kept when they empty.
4. Keep a history row whenever a port's master SM changes.
5. After commit, the caller tells the apps above what changed (inventory.signals.node_reported).

A node's first report, at registration, is :func:`ingest_new_node`: the same
rows, without the reads and diffs a node not yet stored cannot need.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import transaction

from agent import nvlink_rules
from agent.protocol import report_digest
from core.rowinsert import insert_rows
from inventory.models import GPU, IBPort, Node, NVLinkDomain, SubnetManagerChange
from inventory.writes import health


@dataclass
class IngestResult:
    """What a report changed; ``unchanged`` when the digest matched."""

    unchanged: bool = False
    node_fields: list[str] = field(default_factory=list)
    gpus_added: list[int] = field(default_factory=list)
    gpus_updated: list[int] = field(default_factory=list)
    gpus_removed: list[int] = field(default_factory=list)
    ports_changed: list[str] = field(default_factory=list)
    domain_moves: list[tuple[int, str | None, str | None]] = field(default_factory=list)
    sm_changes: int = 0
    writes: int = 0

    @property
    def changed(self) -> bool:
        return bool(self.node_fields or self.gpus_added or self.gpus_updated or self.gpus_removed or self.ports_changed)


def joined_domain(fabric: dict | None) -> nvlink_rules.DomainKey | None:
    """The NVLink domain a card's report says it has joined, or None (the rule: agent.nvlink_rules)."""
    if not fabric:
        return None
    return nvlink_rules.joined_key(
        fabric.get("state"), fabric.get("status"), fabric.get("cluster_uuid"), fabric.get("clique_id")
    )


def node_columns(report: dict) -> dict[str, Any]:
    """The node's columns as this report gives them (absent → None: unknown)."""
    host = report.get("host") if isinstance(report.get("host"), dict) else {}
    imex = report.get("imex") if isinstance(report.get("imex"), dict) else None
    return {
        "hostname": report.get("hostname") or host.get("hostname") or "",
        # Where the node's engines answer (the agent's --advertise-host): the only host
        # a replica's endpoint may name (placement/writes/shard_status.py).
        "mgmt_addr": report.get("address") or "",
        "agent_version": report.get("agent_version") or "",
        "os": host.get("os") or "",
        "os_version": host.get("os_version") or "",
        "arch": host.get("arch") or "",
        "cpu_flags": host.get("cpu_flags"),
        "memory_mb": host.get("memory_mb"),
        "engines": report.get("engines"),
        "disks": report.get("disks"),
        "weights": report.get("weights"),
        "fabrics": report.get("fabrics"),
        "imex_state": (imex or {}).get("state") or "",
        "imex_channels": (imex or {}).get("channels"),
        "imex_nodes": (imex or {}).get("nodes"),
        "problems": report.get("problems") or [],
    }


def gpu_columns(entry: dict) -> dict[str, Any]:
    fabric = entry.get("fabric") if isinstance(entry.get("fabric"), dict) else {}
    return {
        "uuid": entry.get("uuid") or "",
        "name": entry.get("name") or "",
        "gpu_class": entry.get("class") or "",
        "memory_mb": entry.get("memory_mb"),
        "pci_bus": entry.get("pci_bus") or "",
        "numa": entry.get("numa"),
        "nvlink_peers": entry.get("nvlink_peers"),
        "nics": entry.get("nics"),
        "health": entry.get("health") or [],
        "ecc": entry.get("ecc"),
        "remapped_rows": entry.get("remapped_rows"),
        "retired_pages": entry.get("retired_pages"),
        "fabric_state": fabric.get("state") or "",
        "fabric_status": fabric.get("status") or "",
        "cluster_uuid": fabric.get("cluster_uuid") or "",
        "clique_id": fabric.get("clique_id"),
        "fabric_health_summary": fabric.get("health_summary") or "",
        "fabric_bandwidth": fabric.get("bandwidth") or "",
        "fabric_degraded": fabric.get("degraded"),
        "fabric_problems": fabric.get("problems") or [],
        "mig_mode": entry.get("mig_mode") or "",
        "parent_index": entry.get("parent"),
        "mig_uuid": entry.get("mig_uuid") or "",
        "mig_profile": entry.get("mig_profile") or "",
    }


def port_columns(entry: dict, declared: dict[str, str] | None = None) -> dict[str, Any]:
    """A port's columns; its declared fabric comes from the node's ``fabrics`` (name → adapters)."""
    return {
        "state": entry.get("state") or "",
        "phys_state": entry.get("phys_state") or "",
        "rate_gbps": entry.get("rate_gbps"),
        "link_layer": entry.get("link_layer") or "",
        "node_guid": entry.get("node_guid") or "",
        "port_guid": entry.get("port_guid") or "",
        "sm_lid": entry.get("sm_lid"),
        "sm_guid": entry.get("sm_guid") or "",
        "sm_error": (entry.get("sm_error") or "")[:200],
        "network": entry.get("network") or "",
        "fabric": entry.get("fabric") or (declared or {}).get(entry.get("hca") or "", ""),
        "counters": entry.get("counters") or {},
    }


class DomainCache:
    """NVLink domains by key, created on first sight, within one ingestion."""

    def __init__(self) -> None:
        self.by_key: dict[nvlink_rules.DomainKey, NVLinkDomain] = {}

    def get(self, key: nvlink_rules.DomainKey) -> NVLinkDomain:
        if key not in self.by_key:
            self.by_key[key], _ = NVLinkDomain.objects.get_or_create(cluster_uuid=key[0], clique_id=key[1])
        return self.by_key[key]


def _domain_key(domain_id: int | None, domains: dict[int, str]) -> str | None:
    return domains.get(domain_id) if domain_id else None


# A card's memory counters; when they change, the old ones are kept to read a rise against.
MEMORY_COLUMNS = ("ecc", "remapped_rows", "retired_pages")


def _keep_previous_memory(gpu: GPU, diff: list[str], now: datetime) -> list[str]:
    """Keep the counters a report is about to replace (not when they were unknown); the extra columns written."""
    if not set(diff) & set(MEMORY_COLUMNS) or all(getattr(gpu, name) is None for name in MEMORY_COLUMNS):
        return []
    gpu.previous_memory = {name: getattr(gpu, name) for name in MEMORY_COLUMNS}
    gpu.memory_changed_at = now
    return ["previous_memory", "memory_changed_at"]


def _sync_gpus(node: Node, entries: list[dict], result: IngestResult, now: datetime, new: bool = False) -> None:
    """Create, update and delete the node's GPU rows to match the report; ``new``: the node has none stored yet."""
    existing = {} if new else {g.index: g for g in GPU.objects.filter(node=node).select_related("domain")}
    cache = DomainCache()
    names = {g.domain_id: g.domain.key for g in existing.values() if g.domain_id}
    to_create, to_update, changed_fields = [], [], set()
    for entry in entries:
        index = entry["index"]
        columns = gpu_columns(entry)
        key = joined_domain(entry.get("fabric"))
        domain = cache.get(key) if key else None
        columns["domain_id"] = domain.pk if domain else None
        if domain:
            names[domain.pk] = domain.key
        gpu = existing.pop(index, None)
        if gpu is None:
            to_create.append(GPU(node=node, index=index, **columns))
            result.gpus_added.append(index)
            if domain:
                result.domain_moves.append((index, None, domain.key))
            continue
        diff = [name for name, value in columns.items() if getattr(gpu, name) != value]
        if not diff:
            continue
        if "domain_id" in diff:
            result.domain_moves.append((index, _domain_key(gpu.domain_id, names), domain.key if domain else None))
        changed_fields.update(_keep_previous_memory(gpu, diff, now))
        for name in diff:
            setattr(gpu, name, columns[name])
        changed_fields.update(diff)
        to_update.append(gpu)
        result.gpus_updated.append(index)
    if existing:
        for gpu in existing.values():
            if gpu.domain_id:
                result.domain_moves.append((gpu.index, _domain_key(gpu.domain_id, names), None))
        GPU.objects.filter(pk__in=[g.pk for g in existing.values()]).delete()
        result.gpus_removed.extend(sorted(existing))
        result.writes += 1
    if to_create:
        insert_rows(GPU, to_create)
        result.writes += 1
    if to_update:
        GPU.objects.bulk_update(to_update, sorted(changed_fields))
        result.writes += 1


def declared_by_hca(fabrics: Any) -> dict[str, str]:
    """Adapter → the fabric name the node's configuration gives it."""
    out: dict[str, str] = {}
    if isinstance(fabrics, dict):
        for name, hcas in fabrics.items():
            for hca in hcas if isinstance(hcas, list) else []:
                out.setdefault(hca, name)
    return out


def _sync_ports(
    node: Node, entries: list[dict], now: datetime, result: IngestResult, declared: dict[str, str], new: bool = False
) -> None:
    """The same for the node's InfiniBand ports, keeping a history row when a port's SM changes."""
    existing = {} if new else {(p.hca, p.port): p for p in IBPort.objects.filter(node=node)}
    to_create, to_update, changed_fields, history = [], [], set(), []
    for entry in entries:
        key = (entry["hca"], entry["port"])
        columns = port_columns(entry, declared)
        port = existing.pop(key, None)
        if port is None:
            to_create.append(IBPort(node=node, hca=key[0], port=key[1], **columns))
            result.ports_changed.append(f"{key[0]}/{key[1]}")
            continue
        diff = [name for name, value in columns.items() if getattr(port, name) != value]
        if not diff:
            continue
        if "sm_guid" in diff and (port.sm_guid or columns["sm_guid"]):
            history.append(
                SubnetManagerChange(
                    node=node, hca=key[0], port=key[1], old_sm_guid=port.sm_guid, new_sm_guid=columns["sm_guid"], at=now
                )
            )
        if "counters" in diff:
            # The analysis compares error counters with the report before, so keep it.
            port.previous_counters = port.counters
            diff.append("previous_counters")
        for name in diff:
            if name != "previous_counters":
                setattr(port, name, columns[name])
        changed_fields.update(diff)
        to_update.append(port)
        if set(diff) - {"counters", "previous_counters"}:
            result.ports_changed.append(f"{key[0]}/{key[1]}")
    if existing:
        IBPort.objects.filter(pk__in=[p.pk for p in existing.values()]).delete()
        result.ports_changed.extend(f"{h}/{p}" for h, p in existing)
        result.writes += 1
    for batch, op in ((to_create, "create"), (to_update, "update"), (history, "history")):
        if not batch:
            continue
        result.writes += 1
        if op == "update":
            IBPort.objects.bulk_update(batch, sorted(changed_fields))
        else:
            insert_rows(type(batch[0]), batch)
    result.sm_changes = len(history)


def _take_columns(node: Node, report: dict, digest: str, now: datetime, result: IngestResult) -> list[str]:
    """Set the report's node columns on ``node`` (the changed ones in ``result``); the columns to write."""
    columns = node_columns(report)
    liveness = {"last_seen": now, "last_report_at": now, "load": report.get("load")}
    result.node_fields = [name for name, value in columns.items() if getattr(node, name) != value]
    for name, value in {**columns, **liveness, "report_digest": digest}.items():
        setattr(node, name, value)
    return [*result.node_fields, *liveness, "report_digest"]


# No savepoint of its own: its callers never catch what it raises and carry on in the same
# transaction, so a failure rolls back theirs, and a registration is two round trips shorter.
@transaction.atomic(savepoint=False)
def ingest_report(node: Node, report: dict, now: datetime) -> IngestResult:
    """Store a full report (already validated by report_schema) for ``node``."""
    digest = report_digest(report)
    result = IngestResult()
    if digest == node.report_digest:
        result.unchanged = True
        Node.objects.filter(pk=node.pk).update(last_seen=now, last_report_at=now, load=report.get("load"))
        result.writes = 1
        if health.needs_review(node):
            health.review(node, None, {}, now)  # a clean window may have ended since
        return result
    node.save(update_fields=_take_columns(node, report, digest, now, result))
    result.writes += 1
    if "gpus" in report:
        before = health.problems_before(node)
        _sync_gpus(node, report["gpus"], result, now)
        health.review(node, report["gpus"], before, now)
    if "ib_ports" in report:
        _sync_ports(node, report["ib_ports"], now, result, declared_by_hca(report.get("fabrics")))

    return result


@transaction.atomic(savepoint=False)
def ingest_new_node(node: Node, report: dict, now: datetime) -> IngestResult:
    """Insert ``node`` (unsaved) with the report it registers with (validated): what :func:`ingest_report` stores.

    The rows and the result are those of creating the node and then taking
    the report, in a third of the round trips: the node is one INSERT that
    carries the report's columns (not an INSERT, then an UPDATE), and nothing
    is read first, since a node not stored yet has no cards, ports, health
    events or holds to compare with (inventory.writes.health.review_new_node).
    At 10,000 nodes registering at once, each round trip is a second of the
    fleet's registration. Raises IntegrityError when the name was taken by
    another request since the caller looked (the report's values were
    checked against their columns already: report_schema).
    """
    result = IngestResult()
    _take_columns(node, report, report_digest(report), now, result)
    # The row save(force_insert=True) writes, for less CPU (core.rowinsert); nothing listens to Node's save signals.
    insert_rows(Node, [node])
    result.writes += 1
    if "gpus" in report:
        _sync_gpus(node, report["gpus"], result, now, new=True)
        health.review_new_node(node, report["gpus"], now)
    if "ib_ports" in report:
        _sync_ports(node, report["ib_ports"], now, result, declared_by_hca(report.get("fabrics")), new=True)
    return result
