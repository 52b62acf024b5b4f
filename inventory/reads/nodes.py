"""What the API and the console show of nodes, NVLink domains and InfiniBand fabrics.

Both call these functions, so the two can never disagree. Each returns plain
JSON-able data. A key left out means *unknown* (the agent did not say), which
is never the same as empty or zero; the API schema's serializers in
``api/serializers`` describe every shape here.

The listing reads a fixed number of queries whatever the fleet's size: nodes,
their GPUs, and the shards that hold GPUs — never one query per node or GPU.
The shards are placement's rows, so placement reads them and hands them in
(``placement.reads.node_list`` and ``node_detail`` are what callers use).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db.models import Q, QuerySet
from django.utils import timezone

from core import cycles
from core.jsonrows import values_decoded_once
from core.models import AuditEntry
from inventory import devices
from inventory.devices import mig_label
from inventory.fabrics import ERROR_COUNTERS, describe_key, fabric_id
from inventory.models import GPU, CardHold, IBPort, Node, NVLinkDomain

# A load reading older than this is not shown as current: unknown, not idle.
if TYPE_CHECKING:
    from inventory.reads.node_listing import _NodeRow

LOAD_FRESH = timedelta(minutes=1)

GPU_LIST_FIELDS = ("node_id", "index", "gpu_class", "health", "parent_index", "mig_mode", "mig_uuid", "domain_id")
# What each card in the listing's ``gpus`` shows: the seeds' GPUView (index, name, numa,
# nvlink_peers, nearest_nic, nic_path, fabric_state, domain, bandwidth), read as values.
_GPU_WIRING = ("name", "numa", "nvlink_peers", "nics", "fabric_state", "fabric_bandwidth")
_GPU_WIRING_JSON = ("nvlink_peers", "nics")  # the same on every card of a kind: decoded once (core.jsonrows)
# What the node list reads of each GPU: its health only where it has a problem, since decoding
# fourteen thousand empty JSON lists is most of the listing's time on a large fleet.
_GPU_LEAN = [f for f in GPU_LIST_FIELDS if f != "health"]
# What a port's view reads; the node's own page adds previous_counters, for the errors rising since.
PORT_FIELDS = ("hca", "port", "state", "phys_state", "rate_gbps", "link_layer", "fabric", "network", "sm_guid")
PORT_FIELDS += ("sm_lid", "sm_error", "counters")
# Node columns the listing never shows; the node's own page reads them.
_NODE_UNLISTED = ("shard_status", "imex_nodes", "problems", "credential_digest", "report_digest", "machine_id")

# Nodes a page of the streamed listing holds: about 15 MB of views while it is built, and few enough
# queries (four a page; three for the API's JSON listing) that paging adds little to reading the whole fleet at once.
NODE_PAGE = 250

# Traffic counters: they rise with use, so they are reported as bytes, never as errors.
TRAFFIC_COUNTERS = ("port_xmit_data", "port_rcv_data")


class NodeUsage:
    """Which GPUs each node's shards hold, and how many replicas run there.

    Built from (node id, GPU indices, replica id) rows of placement's shards,
    which placement reads (``placement.reads.node_usage``).
    """

    def __init__(self, rows: Iterable[tuple[int, list, str]]) -> None:
        self.used: dict[int, set[int]] = defaultdict(set)
        self.replicas: dict[int, set[str]] = defaultdict(set)
        for node_id, indices, replica_id in rows:
            self.used[node_id].update(devices.held_indices(indices))
            self.replicas[node_id].add(replica_id)


# --- nodes ---------------------------------------------------------------------------


def node_list(
    usage: NodeUsage, now: datetime | None = None, fields: frozenset[str] | None = None, wiring: bool = False
) -> list[dict[str, Any]]:
    """Every node as ``ctl nodes`` and the console's node table show it, given what its shards hold.

    ``usage`` is read by placement, whose rows the shards are: callers list
    nodes through ``placement.reads.node_list``.

    ``wiring`` adds each node's ``gpus`` and ``ib_ports``, as the API lists
    them; the console's tables and the summary do without, since reading them
    is most of a large fleet's listing. ``fields`` keeps only those top-level
    keys (``?fields=`` in the API), and skips the cards and ports unless named.
    """
    with cycles.uncollected():
        return _node_list(usage, now or timezone.now(), fields, wiring)[0]


def node_pages(
    usage: NodeUsage,
    now: datetime | None = None,
    fields: frozenset[str] | None = None,
    wiring: bool = False,
    size: int | None = None,
    after: str | None = None,
) -> Iterator[list[dict[str, Any]]]:
    """The listing of :func:`node_list` in pages of ``size`` nodes by name, each read when it is asked for.

    For an answer streamed as it is built: memory holds one page, whatever the
    fleet's size. Each page reads the same few queries (its nodes, then their
    cards and ports by id); pages follow one another by name, so a node added
    or removed while the pages are read is listed at most once, every other
    node exactly once. ``after`` starts the first page after that name (the console's pages).
    """
    now, size = now or timezone.now(), size or NODE_PAGE
    domains = _domain_keys()
    while True:
        with cycles.uncollected():
            page, after = _node_list(usage, now, fields, wiring, domains, after=after, limit=size)
        if page:
            yield page
        if len(page) < size:
            return


def _node_list(
    usage: NodeUsage,
    now: datetime,
    fields: frozenset[str] | None,
    wiring: bool,
    domains: Mapping[int, str] | None = None,
    after: str | None = None,
    limit: int | None = None,
) -> tuple[list[dict[str, Any]], str | None]:
    """Every node, or (``limit``) the first ``limit`` after the name ``after`` with only their cards and ports read.

    Answers the views and the last node's name (where the next page starts).
    """
    cards = wiring and (fields is None or "gpus" in fields)
    rows = Node.objects.order_by("name")
    if after is not None:
        rows = rows.filter(name__gt=after)
    if limit is not None:
        rows = rows[:limit]
    nodes = _listed_nodes(rows)
    gpu_rows, port_rows = GPU.objects.all(), IBPort.objects.all()
    if limit is not None:
        ids = [n.pk for n in nodes]
        gpu_rows, port_rows = gpu_rows.filter(node_id__in=ids), port_rows.filter(node_id__in=ids)
    gpus = _listed_gpus(gpu_rows, cards)
    ports: dict[int, list[dict]] = defaultdict(list)
    if wiring and (fields is None or "ib_ports" in fields):
        physical: dict[tuple, tuple[str, str]] = {}
        for p in port_rows.order_by("node_id", "hca", "port").values("node_id", *PORT_FIELDS):
            ports[p["node_id"]].append(_port_view(p, physical))
    domains = _domain_keys() if domains is None else domains
    nearest: dict[tuple, tuple[str, str] | None] = {}
    out, last = [], None
    for n in nodes:
        last = n.name
        view = _node_view(n, gpus[n.pk], usage, domains, now)
        if cards:
            view["gpus"] = [_gpu_brief(g, domains, nearest) for g in gpus[n.pk]]
        if wiring:
            view["ib_ports"] = ports[n.pk]
        out.append(view if fields is None else {k: v for k, v in view.items() if k in fields})
    return out, last


def _listed_gpus(rows: QuerySet, cards: bool) -> dict[int, list[dict]]:
    """Node id → its GPUs as the listing reads them (``GPU_LIST_FIELDS``, with the wiring when ``cards``)."""
    problems = {(n, i): h for n, i, h in rows.exclude(health=[]).values_list("node_id", "index", "health")}
    gpus: dict[int, list[dict]] = defaultdict(list)
    listed = rows.order_by("node_id", "index")
    for g in values_decoded_once(listed, (*_GPU_LEAN, *(_GPU_WIRING if cards else ())), _GPU_WIRING_JSON):
        g["health"] = problems.get((g["node_id"], g["index"])) or []
        gpus[g["node_id"]].append(g)
    return gpus


# What the API's listing reads of each node: the columns _node_view_of reads, no model instance.
def _totals(by_class: list[dict[str, Any]]) -> dict[str, int]:
    """A node's devices and free devices, from its counts by class."""
    return {"gpu_total": sum(c["total"] for c in by_class), "gpu_free": sum(c["free"] for c in by_class)}


def _listed_nodes(rows: QuerySet) -> list[Node]:
    """The listing's nodes, their unlisted columns deferred, each distinct JSON value decoded once (core.jsonrows).

    Nodes of one kind repeat their labels, engines, disks, fabrics and CPU
    flags; decoding them per node was a large part of listing a big fleet.
    """
    names = [f.attname for f in Node._meta.concrete_fields if f.name not in _NODE_UNLISTED]
    json_fields = [f.attname for f in Node._meta.concrete_fields if f.get_internal_type() == "JSONField"]
    db = rows.db
    return [Node.from_db(db, names, [r[n] for n in names]) for r in values_decoded_once(rows, names, json_fields)]


def _gpu_brief(g: Mapping[str, Any], domains: Mapping[int, str], nearest: dict) -> dict[str, Any]:
    """One card as the listing shows it: the seeds' GPUView names, from a values() row (no instance per card).

    ``nearest`` remembers each adapter map's nearest adapter: card 3 of every
    HGX node has the same map, so a fleet has a few dozen, not one per card.
    """
    view: dict[str, Any] = {"index": g["index"], "label": mig_label(g["index"]), "name": g["name"]}
    view["class"] = g["gpu_class"]
    _put(view, "numa", g["numa"])
    _put(view, "nvlink_peers", g["nvlink_peers"])
    nics = g["nics"]
    key = tuple(nics.items()) if isinstance(nics, dict) else ()
    if key not in nearest:
        nearest[key] = devices.nearest_nic(nics if isinstance(nics, dict) else None)
    if near := nearest[key]:
        view["nearest_nic"], view["nic_path"] = near
    _put(view, "fabric_state", g["fabric_state"] or None)
    _put(view, "domain", domains.get(g["domain_id"]) if g["domain_id"] is not None else None)
    _put(view, "bandwidth", g["fabric_bandwidth"] or None)
    return view


def node_detail(
    node: Node,
    usage: NodeUsage,
    holders: Mapping[int, str],
    shards: list[dict[str, Any]],
    now: datetime | None = None,
) -> dict[str, Any]:
    """One node with its cards (NVLink peers, NUMA, nearest adapter, fabric), ports and shards.

    What is placed on it is placement's to read, and callers show a node
    through ``placement.reads.node_detail``: ``usage`` is what its shards
    hold, ``holders`` GPU index → the replica holding it (``model#id``), and
    ``shards`` the shards placed there as placement shows them.
    """
    now = now or timezone.now()
    rows = list(GPU.objects.filter(node=node).select_related("domain").order_by("index"))
    listed = [{f: getattr(g, f) for f in GPU_LIST_FIELDS} for g in rows]
    view = _node_view(node, listed, usage, _domain_keys(), now)
    view["gpus"] = [_gpu_view(g, holders.get(g.index)) for g in rows]
    port_rows = IBPort.objects.filter(node=node).order_by("hca", "port").values(*PORT_FIELDS, "previous_counters")
    view["ib_ports"] = [_port_view(p) for p in port_rows]
    view["shards"] = shards
    _put(view, "disks", node.disks)
    _put(view, "weights", node.weights)
    _put(view, "imex_nodes", node.imex_nodes)
    view["problems"] = list(node.problems or [])
    view["held_gpus"] = [
        {"gpu": h.gpu_index, "since": h.since.isoformat(), "reason": h.reason}
        for h in CardHold.objects.filter(node=node).order_by("gpu_index")
    ]
    _put(view, "health_cordon", node.health_cordon or None)
    view["health_actions"] = health_actions(node)
    return view


HEALTH_ACTOR = "health"  # inventory.writes.health's actor in the audit log


def health_actions(node: Node, limit: int = 50) -> list[dict[str, Any]]:
    """What card health did on a node (held, released cards; cordoned, uncordoned), newest first."""
    rows = AuditEntry.objects.filter(
        Q(target=node.name) | Q(target__startswith=f"{node.name} gpu "), actor=HEALTH_ACTOR
    ).order_by("-at", "-pk")[:limit]
    return [
        {"at": r.at.isoformat(), "action": r.action, "target": r.target, "reason": (r.detail or {}).get("reason", "")}
        for r in rows
    ]


def _node_view(
    node: Node, gpus: list[dict], usage: NodeUsage, domains: Mapping[int, str], now: datetime
) -> dict[str, Any]:
    by_class = devices.count_by_class(gpus, usage.used.get(node.pk, set()))
    unhealthy, domain = devices.out_of_placement(gpus), _node_domain(gpus, domains)
    return _node_view_of(node, by_class, unhealthy, domain, len(usage.replicas.get(node.pk, ())), now)


def _node_view_of(
    node: Node | _NodeRow,
    by_class: list[dict[str, Any]],
    unhealthy: list[str],
    domain: str | None,
    replicas: int,
    now: datetime,
) -> dict[str, Any]:
    """A node's view (without its cards and ports), given what its GPUs come to: counts, problems, domain."""
    view: dict[str, Any] = {
        "id": node.name,
        "state": node.state,
        "reachable": node.reachable,
        "lost": node.lost,
        "labels": {str(k): str(v) for k, v in node.labels.items()} if isinstance(node.labels, dict) else {},
        **_totals(by_class),
        "devices": by_class,
        "gpu_classes": [c["class"] for c in by_class],
        "unhealthy_gpus": unhealthy,
        "replicas": replicas,
        "warnings": _warnings(node),
    }
    _put(view, "hostname", node.hostname or None)
    _put(view, "mgmt_addr", node.mgmt_addr or None)
    _put(view, "report_error", node.report_error or None)
    _put(view, "agent_version", node.agent_version or None)
    _put(view, "os", " ".join(p for p in (node.os, node.os_version, node.arch) if p) or None)
    _put(view, "memory_gb", None if node.memory_mb is None else node.memory_mb // 1024)
    _put(view, "engines", None if node.engines is None else sorted(node.engines))
    _put(view, "models_on_disk", _weight_names(node.weights))
    _put(view, "fabrics", None if node.fabrics is None else sorted(node.fabrics))
    _disk_space(view, node.disks)
    _liveness(view, node, now)
    _put(view, "nvlink_domain", domain)
    _put(view, "imex", node.imex_state or None)
    channels = _channels(node.imex_channels)
    # The seeds' type is a count (Go's IMEXChannels int); the channels themselves sit beside it.
    _put(view, "imex_channels", None if channels is None else len(channels))
    _put(view, "imex_channel_ids", channels)
    return view


def _put(view: dict, key: str, value: Any) -> None:
    """Set ``key`` only when the value is known: an absent key is how the API says unknown."""
    if value is not None:
        view[key] = value


def _channels(channels: list | None) -> list[int] | None:
    if not isinstance(channels, list):
        return None
    return [c for c in channels if isinstance(c, int) and not isinstance(c, bool)]


def _warnings(node: Node) -> list[str]:
    """Facts that make a machine slow without making it unhealthy."""
    out = []
    if node.arch in ("x86_64", "amd64") and node.has_avx2 is False:
        out.append('no AVX2: CPU inference runs several times slower (a VM needs CPU type "host")')
    if node.report_error:
        out.append(f"its last full report was refused, so what is shown is from the one before: {node.report_error}")
    return out


def _weight_names(weights: list | None) -> list[str] | None:
    if weights is None:
        return None
    return sorted({str(w.get("name") or w.get("path")) for w in weights if isinstance(w, dict)})


def _disk_space(view: dict, disks: list | None) -> None:
    """Local model filesystems summed; shared ones left out (a filer's space is not each node's to spend)."""
    local = [d for d in disks or [] if isinstance(d, dict) and not d.get("shared")]
    totals = [d.get("total_bytes") for d in local]
    if not local or not all(isinstance(t, int) for t in totals):
        return
    view["disk_total_gb"] = sum(totals) // 2**30
    frees = [d.get("free_bytes") for d in local]
    if all(isinstance(f, int) for f in frees):
        view["disk_free_gb"] = sum(frees) // 2**30


def _liveness(view: dict, node: Node, now: datetime) -> None:
    # Always present, as the seeds' ``ctl`` reads it: "" when the node was never heard from.
    view["last_seen_ago"] = ""
    if node.last_seen is None:
        return
    age = max(0, int((now - node.last_seen).total_seconds()))
    view["last_seen_ago"] = go_duration(age)
    view["last_seen"] = node.last_seen.isoformat()
    view["last_seen_seconds"] = age
    if isinstance(node.load, dict) and now - node.last_seen <= LOAD_FRESH:
        view["load"] = load_view(node.load, age)


def go_duration(seconds: int) -> str:
    """Whole seconds the way the seeds' Go ``time.Duration.String`` writes them: 0s, 45s, 3m5s, 26h0m1s."""
    hours, rest = divmod(max(0, seconds), 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    return f"{minutes}m{secs}s" if minutes else f"{secs}s"


def load_view(load: Mapping[str, Any], age_s: int) -> dict[str, Any]:
    """The agent's load reading, only the figures it sent; ``memory_percent`` is used over total.

    The memory figures come in MB (llmgw's own names) and in bytes under the
    seeds' names (``memory_used_bytes``, ``memory_total_bytes``), so a script
    written for either reads them.
    """
    out: dict[str, Any] = {"age_seconds": age_s}
    for key in ("cpu_percent", "cpus", "load1", "load5", "load15", "memory_used_mb", "memory_total_mb"):
        if isinstance(load.get(key), int | float) and not isinstance(load.get(key), bool):
            out[key] = load[key]
    for mb, seed in (("memory_used_mb", "memory_used_bytes"), ("memory_total_mb", "memory_total_bytes")):
        if mb in out:
            out[seed] = int(out[mb] * 2**20)
    if out.get("memory_total_mb") and "memory_used_mb" in out:
        out["memory_percent"] = round(out["memory_used_mb"] * 100 / out["memory_total_mb"], 1)
    return out


def _domain_keys() -> dict[int, str]:
    rows = NVLinkDomain.objects.values_list("pk", "cluster_uuid", "clique_id")
    return {pk: f"{uuid}/{clique}" for pk, uuid, clique in rows}


def _node_domain(gpus: list[dict], domains: Mapping[int, str]) -> str | None:
    """The domain every card has joined; None when any card has joined none (or another)."""
    cards = [g for g in gpus if g["parent_index"] is None]
    joined = {g["domain_id"] for g in cards}
    if not cards or len(joined) != 1 or None in joined:
        return None
    return domains.get(joined.pop())


def _gpu_view(g: GPU, held_by: str | None) -> dict[str, Any]:
    view: dict[str, Any] = {
        "index": g.index,
        "label": g.label,
        "name": g.name,
        "class": g.gpu_class,
        "uuid": g.uuid,
        "healthy": g.healthy,
        "health": list(g.health or []),
    }
    _put(view, "memory_mb", g.memory_mb)
    _put(view, "numa", g.numa)
    _put(view, "nvlink_peers", g.nvlink_peers)
    _put(view, "nics", g.nics)
    if near := devices.nearest_nic(g.nics):
        view["nearest_nic"], view["nic_path"] = near
    _put(view, "fabric_state", g.fabric_state or None)
    _put(view, "fabric_status", g.fabric_status or None)
    _put(view, "bandwidth", g.fabric_bandwidth or None)
    _put(view, "degraded", g.fabric_degraded)
    _put(view, "domain", g.domain.key if g.domain else None)
    _put(view, "mig_mode", g.mig_mode or None)
    if g.parent_index is not None:
        view["parent"] = g.parent_index
        _put(view, "mig_profile", g.mig_profile or None)
    _put(view, "held_by", held_by)
    return view


def _port_view(p: Mapping[str, Any], physical: dict | None = None) -> dict[str, Any]:
    """One port from a values() row of PORT_FIELDS; ``errors_rising`` too when the row has ``previous_counters``.

    ``physical`` remembers each (fabric key, SM LID)'s words and id: the ports of a fabric share a few.
    """
    counters = p["counters"] if isinstance(p["counters"], dict) else {}
    state = p["state"]
    view: dict[str, Any] = {"hca": p["hca"], "port": p["port"], "state": state, "active": "ACTIVE" in state.upper()}
    _put(view, "phys_state", p["phys_state"] or None)
    _put(view, "rate_gbps", _whole(p["rate_gbps"]))
    _put(view, "link_layer", p["link_layer"] or None)
    _put(view, "fabric", p["fabric"] or None)
    roce = p["link_layer"].lower() == "ethernet"
    network, sm_guid = p["network"], p["sm_guid"]
    key = (f"roce:{network}" if network else None) if roce else (f"sm:{sm_guid}" if sm_guid else None)
    if key:
        lid = None if roce else p["sm_lid"]
        if physical is None or (named := physical.get((key, lid))) is None:
            named = (describe_key(key, lid), fabric_id(key))
            if physical is not None:
                physical[(key, lid)] = named
        view["physical"], view["physical_id"] = named
    _put(view, "sm_error", p["sm_error"] or None)
    # A counter at zero (most of them) is no error: skipped before the full check.
    errors = {k: int(counters[k]) for k in ERROR_COUNTERS if counters.get(k) and _positive(counters[k])}
    view["errors"] = errors
    previous = p.get("previous_counters")
    if isinstance(previous, dict):
        view["errors_rising"] = {
            k: v - int(previous[k])
            for k, v in errors.items()
            if _positive(previous.get(k), zero=True) and v > int(previous[k])
        }
    for name, key in (("tx_bytes", "port_xmit_data"), ("rx_bytes", "port_rcv_data")):
        if _positive(counters.get(key), zero=True):
            view[name] = int(counters[key])
    return view


def _whole(rate: float | None) -> float | int | None:
    """A rate as an int when it is one: the seeds' ``rate_gbps`` is a Go int, which cannot decode 400.0."""
    return int(rate) if isinstance(rate, float) and rate.is_integer() else rate


def _positive(value: Any, zero: bool = False) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return value >= 0 if zero else value > 0


def node_logs(name: str, shard: str | None = None) -> dict[str, Any] | None:
    """The last lines each shard's engine wrote, as the agent sent them; None when the node is unknown.

    ``shard`` picks one shard by its id (``<replica>-<rank>``) or its replica
    id. A shard the agent sent no lines for has ``lines`` absent: unknown.
    """
    node = Node.objects.filter(name=name).only("name", "shard_status", "last_seen").first()
    if node is None:
        return None
    shards = []
    for s in node.shard_status or []:
        if not isinstance(s, dict) or not isinstance(s.get("id"), str):
            continue
        if shard and shard not in (s["id"], s.get("replica")):
            continue
        entry: dict[str, Any] = {"id": s["id"]}
        for key in ("replica", "state"):
            if isinstance(s.get(key), str):
                entry[key] = s[key]
        if isinstance(s.get("log_tail"), list):
            entry["lines"] = [str(line) for line in s["log_tail"]]
        shards.append(entry)
    view: dict[str, Any] = {"node": node.name, "shards": shards}
    _put(view, "reported_at", node.last_seen.isoformat() if node.last_seen else None)
    return view
