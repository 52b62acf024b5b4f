"""``/metrics`` on the admin listener: this process's own figures and the fleet's, for Prometheus.

Two registries go out in one answer:

- prometheus_client's default registry: what django-prometheus measures in
  this process (requests, responses, latency, database queries), plus the
  Python process collectors;
- the fleet, computed from the inventory at scrape time by :class:`FleetCollector`
  in a fixed number of queries, whatever the size of the fleet (no query per
  node or GPU).

Label values are bounded: node, GPU and model names, classes and states —
never request ids or free text — so the number of series follows the fleet,
not the traffic.

A scraper authenticates with a bearer API token: an operator's, or a
read-only one issued for it (``ApiToken.read_only``). Anything else is 401.

Other apps' figures: :data:`SOURCES` names the functions yielding metric
families (the gateway's requests, tokens and latency, ``gateway.metrics``)
that every scrape adds. Observability sits above the apps it reads, so it
names their sources here rather than being told them from below;
:func:`register_source` adds one more. Like the reconcile histogram, figures
summed across processes must be stored outside process memory (the database
or Redis), because any process may answer the scrape.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from typing import NamedTuple

from django.conf import settings
from django.db.models import Count
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.views.decorators.http import require_GET
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.registry import Collector
from rest_framework import exceptions

from agent import nvlink_rules
from catalog.models import CatalogModel
from core import access, cycles, dbtimes, histograms
from core.auth import BearerTokenAuthentication
from core.models import Finding
from gateway import metrics as gateway_metrics
from inventory.devices import mig_label
from inventory.models import GPU, Node, NVLinkDomain
from observability import exposition as exposition_text
from observability.fleet_summary import gpu_counts
from placement.models import Replica
from placement.reads import desired_and_running as _desired_and_running
from placement.writes.load import fleet as fleet_load

log = logging.getLogger(__name__)

RECONCILE_HISTOGRAM = "llmgw_reconcile_seconds"
# A reconcile of a quiet fleet takes tens of milliseconds; one placing a large model across a rack, seconds.
RECONCILE_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# The states of /api/v1/summary's counts, and what is left of the total: healthy, unused, on a closed node.
COUNTED_STATES = ("used", "free", "unhealthy", "held")
GPU_STATES = (*COUNTED_STATES, "unavailable")
REPLICA_STATES = ("pending", "starting", "ready", "failed", "stopping")

Source = Callable[[], Iterable[Metric]]
# name -> a function yielding metric families, called at every scrape (see the module docstring).
SOURCES: dict[str, Source] = {"gateway": gateway_metrics.collect}

_run = threading.local()


def register_source(name: str, collect: Source) -> None:
    """Add ``collect``'s families to every scrape, beside those :data:`SOURCES` names; the same name replaces it."""
    SOURCES[name] = collect


def observe_reconcile(seconds: float) -> None:
    """Record one reconcile's duration in the fleet-wide histogram.

    Every run of the Celery task "placement.tasks.reconcile" is already timed
    (observability.tasks); a reconcile that calls this itself is not counted
    twice, and one that runs outside Celery is counted only through this.
    """
    histograms.observe(RECONCILE_HISTOGRAM, seconds, RECONCILE_BUCKETS)
    _run.observed = True


def begin_task_run() -> None:
    _run.observed = False


def observed_in_this_run() -> bool:
    return getattr(_run, "observed", False)


# --- the fleet -----------------------------------------------------------------------------------------------------


class GpuRow(NamedTuple):
    node_id: int
    index: int
    parent_index: int | None
    fabric_state: str
    fabric_status: str
    cluster_uuid: str
    clique_id: int | None
    domain_id: int | None
    fabric_degraded: bool | None


def _fabric_words(gpus: list[GpuRow]) -> list[tuple[bool, str]]:
    """Each card's (expects a multi-node domain, the domain it names as text), by the NVLink rules.

    Asked once per distinct report, not per card: a fleet's 80,000 cards report a few hundred
    different fabric words (a rack's cards name one domain; an HGX box's, none), and asking the
    rules for each card was a sixth of a scrape at 10,000 nodes.
    """
    seen: dict[tuple, tuple[bool, str]] = {}
    out = []
    for g in gpus:
        key = (g.fabric_state, g.fabric_status, g.cluster_uuid, g.clique_id)
        words = seen.get(key)
        if words is None:
            words = seen[key] = (
                nvlink_rules.expects_domain(*key),
                nvlink_rules.claimed_text(g.cluster_uuid, g.clique_id),
            )
        out.append(words)
    return out


class FleetCollector(Collector):
    """The fleet's figures, read from the inventory at each scrape in a fixed number of queries."""

    def __init__(self, now: Callable[[], datetime] = timezone.now) -> None:
        self.now = now

    def collect(self) -> Iterator[Metric]:
        # The last heartbeat as microseconds (core.dbtimes): building 10,000 datetimes was a tenth of a scrape.
        seen = dbtimes.with_microseconds(Node.objects.all(), seen_us="last_seen")
        nodes = list(seen.values_list("pk", "name", "state", "reachable", "lost", "seen_us", "imex_state"))
        names = {pk: name for pk, name, *_ in nodes}
        domains = {pk: f"{u}/{c}" for pk, u, c in NVLinkDomain.objects.values_list("pk", "cluster_uuid", "clique_id")}
        # In the table's order, not by node name: sorting every card was a tenth of a scrape, and only
        # the few written per card are put in order (_nvlink).
        rows = GPU.objects.order_by().values_list(*GpuRow._fields)
        gpus = [GpuRow._make(row) for row in rows]
        fabric = _fabric_words(gpus)
        yield from self._nvlink(gpus, fabric, names, domains)
        yield from self._nodes(nodes, gpus, fabric)
        yield from self._gpus()
        yield from self._catalog()
        yield from self._autoscale()
        yield from self._findings()
        yield self._reconcile()
        yield from self._sources()

    def _nvlink(self, gpus, fabric, names, domains) -> Iterator[Metric]:
        joined = GaugeMetricFamily(
            "llmgw_gpu_nvlink_joined",
            "1 when the card has joined its multi-node NVLink domain, 0 when not.",
            labels=["node", "gpu", "domain"],
        )
        degraded = GaugeMetricFamily(
            "llmgw_gpu_nvlink_degraded",
            "1 when the card's NVLink bandwidth is degraded (joined, but amber).",
            labels=["node", "gpu", "domain"],
        )
        # A card that has, or should have, a multi-node domain; a joined card names the one it joined.
        cards = sorted(
            (
                (names[g.node_id], g.index, g, claimed)
                for g, (expects, claimed) in zip(gpus, fabric, strict=True)
                if g.parent_index is None and (g.domain_id is not None or expects)
            ),
            key=lambda card: card[:2],
        )
        for name, index, g, claimed in cards:
            labels = [name, mig_label(index), domains.get(g.domain_id, claimed)]
            joined.add_metric(labels, 1.0 if g.domain_id is not None else 0.0)
            degraded.add_metric(labels, 1.0 if g.fabric_degraded else 0.0)
        yield joined
        yield degraded

    def _nodes(self, nodes, gpus, fabric) -> Iterator[Metric]:
        in_domain = {
            g.node_id for g, (_, claimed) in zip(gpus, fabric, strict=True) if g.domain_id is not None or claimed
        }
        up = GaugeMetricFamily("llmgw_node_up", "1 when the node answers its heartbeats.", labels=["node", "state"])
        age = GaugeMetricFamily(
            "llmgw_node_heartbeat_age_seconds", "Seconds since the node's last heartbeat.", labels=["node"]
        )
        imex = GaugeMetricFamily(
            "llmgw_imex_up",
            "1 when IMEX is up on a node that has it or whose cards are in a multi-node domain.",
            labels=["node"],
        )
        now = dbtimes.now_microseconds(self.now())
        for pk, name, state, reachable, lost, seen_us, imex_state in nodes:
            up.add_metric([name, state], 1.0 if reachable and not lost else 0.0)
            if seen_us is not None:
                # As timedelta.total_seconds() says it: the whole microseconds over a million.
                age.add_metric([name], max(0.0, (now - seen_us) / 10**6))
            if pk in in_domain or imex_state not in ("", "not installed"):
                imex.add_metric([name], 1.0 if imex_state == "up" else 0.0)
        yield from (up, age, imex)

    def _gpus(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "llmgw_gpus",
            "Devices (whole cards, and MIG instances in place of the card carved into them) by class and state, "
            "counted as /api/v1/summary counts them: used (held by a shard), free (on a ready, reachable node), "
            "unhealthy (whoever holds it), held (held back: MIG mode with no instances, an instance without its "
            "MIG UUID), unavailable (healthy and unused on a node that takes no work).",
            labels=["class", "state"],
        )
        for counts in gpu_counts(free_nodes=False).classes:
            unavailable = counts["total"] - sum(counts[s] for s in COUNTED_STATES)
            for state in COUNTED_STATES:
                family.add_metric([counts["class"], state], float(counts[state]))
            family.add_metric([counts["class"], "unavailable"], float(unavailable))
        yield family

    def _catalog(self) -> Iterator[Metric]:
        models = list(CatalogModel.objects.values_list("name", "parked_at", "min_replicas"))
        counts = {
            (row["model__name"], row["state"]): row["n"]
            for row in Replica.objects.values("model__name", "state").annotate(n=Count("id"))
        }
        replicas = GaugeMetricFamily("llmgw_replicas", "Replicas of each model by state.", labels=["model", "state"])
        parked = GaugeMetricFamily(
            "llmgw_model_parked", "1 when the model is parked after failing every start.", labels=["model"]
        )
        # The minimum beside the ready count lets an alert say "short" in PromQL
        # (min_replicas > ignoring(state) llmgw_replicas{state="ready"}).
        minimum = GaugeMetricFamily(
            "llmgw_model_min_replicas", "Replicas the catalog keeps ready (0: on demand).", labels=["model"]
        )
        for name, parked_at, min_replicas in models:
            for state in REPLICA_STATES:
                replicas.add_metric([name, state], float(counts.get((name, state), 0)))
            parked.add_metric([name], 1.0 if parked_at else 0.0)
            minimum.add_metric([name], float(min_replicas or 0))
        yield replicas
        yield parked
        yield minimum

    def _autoscale(self) -> Iterator[Metric]:
        """Desired against running replicas per model, and the load the autoscaler reads (every worker summed)."""
        desired = GaugeMetricFamily(
            "llmgw_model_replicas_desired",
            "Replicas each model wants now: the autoscaler's count when max > min, else the minimum.",
            labels=["model"],
        )
        running = GaugeMetricFamily(
            "llmgw_model_replicas_running", "Replicas of each model that are ready.", labels=["model"]
        )
        known = []
        for name, count, ready in _desired_and_running():
            known.append(name)
            desired.add_metric([name], float(count))
            running.add_metric([name], float(ready))
        yield from (desired, running)
        signals = {
            "in_flight": GaugeMetricFamily(
                "llmgw_model_requests_in_flight",
                "Requests on each model's replicas, every gateway worker's.",
                labels=["model"],
            ),
            "waiting": GaugeMetricFamily(
                "llmgw_model_requests_waiting",
                "Requests waiting for a replica of each model to be ready.",
                labels=["model"],
            ),
            "tokens": GaugeMetricFamily(
                "llmgw_model_tokens_per_second",
                "Completion tokens per second over the last ten seconds.",
                labels=["model"],
            ),
            "ttft": GaugeMetricFamily(
                "llmgw_model_time_to_first_token_seconds",
                "Mean time to the first token of requests ended in the last ten seconds.",
                labels=["model"],
            ),
        }
        seen = fleet_load(self.now(), getattr(settings, "LLMGW_REDIS_URL", None))
        for name in known:
            figures = seen.of(name)
            signals["in_flight"].add_metric([name], float(figures.in_flight))
            signals["waiting"].add_metric([name], float(figures.waiting))
            signals["tokens"].add_metric([name], figures.tokens_per_s)
            if figures.ttft_ms is not None:
                signals["ttft"].add_metric([name], figures.ttft_ms / 1000)
        yield from signals.values()

    def _findings(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "llmgw_findings_open", "Open findings of the doctor sweeps by kind.", labels=["kind", "severity"]
        )
        rows = Finding.objects.open().values("kind", "severity").annotate(n=Count("id")).order_by("kind", "severity")
        for row in rows:
            family.add_metric([row["kind"], row["severity"]], float(row["n"]))
        yield family

    def _reconcile(self) -> Metric:
        snap = histograms.snapshot(RECONCILE_HISTOGRAM, RECONCILE_BUCKETS)
        family = HistogramMetricFamily(
            RECONCILE_HISTOGRAM, "How long each reconcile of placement took, across every worker."
        )
        family.add_metric([], snap.buckets, snap.total)
        return family

    def _sources(self) -> Iterator[Metric]:
        status = GaugeMetricFamily(
            "llmgw_metrics_source_up", "1 when an extra metrics source answered this scrape.", labels=["source"]
        )
        for name, collect in sorted(SOURCES.items()):
            try:
                families = list(collect())
            except Exception:
                # One broken source must not cost the fleet's figures; its gauge says it failed.
                log.exception("metrics source %s failed", name)
                status.add_metric([name], 0.0)
                continue
            status.add_metric([name], 1.0)
            yield from families
        yield status


FLEET = CollectorRegistry(auto_describe=False)
FLEET.register(FleetCollector())


def exposition() -> bytes:
    """The whole answer: this process's registry, then the fleet's."""
    # A sample object per node, card and replica, none in a cycle: the collector's passes over the
    # whole heap while they pile up were a sixth of a scrape at 2,000 nodes, and grow with the fleet.
    with cycles.uncollected():
        return generate_latest(REGISTRY) + exposition_text.text(FLEET.collect())


# --- the view ------------------------------------------------------------------------------------------------------


def _refusal(message: str) -> HttpResponse:
    response = HttpResponse(message + "\n", status=401, content_type="text/plain; charset=utf-8")
    response["WWW-Authenticate"] = 'Bearer realm="llmgw"'
    return response


@require_GET
def metrics_view(request: HttpRequest) -> HttpResponse:
    """Prometheus's scrape: an API token as bearer (a read-only one will do), else 401; 403 without the permission."""
    try:
        found = BearerTokenAuthentication().authenticate(request)
    except exceptions.AuthenticationFailed as exc:
        return _refusal(str(exc.detail))
    if found is None:
        return _refusal("send an API token as 'Authorization: Bearer <token>' (a read-only one will do)")
    if why := access.refusal(found[0], "metrics", request.method):
        return HttpResponse(why + "\n", status=403, content_type="text/plain; charset=utf-8")
    # The classic text format, which every Prometheus version reads (the output uses no newer feature).
    return HttpResponse(exposition(), content_type=CONTENT_TYPE_PLAIN_0_0_4)
