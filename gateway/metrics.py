"""The gateway's figures for ``/metrics``: requests, tokens and latency, read from what usage recorded.

Read from the database rather than kept in process memory, because every
gateway process serves part of the traffic and a scrape reaches only one of
them. Counters sum the hourly roll-up (monotonic for as long as usage is
kept); latency is given as quantiles over the last five minutes, per model
and kind of request, from the per-request records. Labels are the catalog's
model names and a fixed set of words: nothing a client chooses.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from datetime import timedelta

from django.db.models import Sum
from django.utils import timezone
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gateway.models import Budget, SetAsideUsage, UsageHour, UsageRecord
from gateway.writes.budgets import spent_now

LATENCY_WINDOW = timedelta(minutes=5)
QUANTILES = (0.5, 0.99)


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def collect() -> Iterator[Metric]:
    requests = CounterMetricFamily(
        "llmgw_gateway_requests", "Requests through the gateway.", labels=["model", "result"]
    )
    tokens = CounterMetricFamily("llmgw_gateway_tokens", "Tokens served through the gateway.", labels=["model", "kind"])
    cost = CounterMetricFamily("llmgw_gateway_cost_micros", "Cost charged, in millionths.", labels=["model"])
    clamped = CounterMetricFamily(
        "llmgw_gateway_usage_clamped",
        "Requests whose engine reported more tokens than the request allowed, recorded at its bounds.",
        labels=["model"],
    )
    rows = (
        UsageHour.objects.values("model")
        .annotate(
            requests=Sum("requests"),
            errors=Sum("errors"),
            prompt=Sum("prompt_tokens"),
            completion=Sum("completion_tokens"),
            cost=Sum("cost_micros"),
            clamped=Sum("clamped"),
        )
        .order_by("model")
    )
    for row in rows:
        model = row["model"] or "(unresolved)"
        requests.add_metric([model, "ok"], row["requests"] - row["errors"])
        requests.add_metric([model, "error"], row["errors"])
        tokens.add_metric([model, "prompt"], row["prompt"])
        tokens.add_metric([model, "completion"], row["completion"])
        cost.add_metric([model], row["cost"])
        clamped.add_metric([model], row["clamped"])
    set_aside = CounterMetricFamily(
        "llmgw_gateway_usage_records_set_aside",
        "Usage records the database refused, kept aside instead of blocking the rest (gateway.writes.usage).",
    )
    set_aside.add_metric([], SetAsideUsage.objects.count())
    yield from (requests, tokens, cost, clamped, set_aside)
    yield _budgets()

    latency = GaugeMetricFamily(
        "llmgw_gateway_latency_seconds",
        "Request latency over the last five minutes, by quantile.",
        labels=["model", "stream", "quantile"],
    )
    ttfb = GaugeMetricFamily(
        "llmgw_gateway_first_byte_seconds",
        "Time to the first byte of streamed answers over the last five minutes.",
        labels=["model", "quantile"],
    )
    since = timezone.now() - LATENCY_WINDOW
    totals: dict[tuple[str, bool], list[float]] = defaultdict(list)
    firsts: dict[str, list[float]] = defaultdict(list)
    for model, stream, ms, first in UsageRecord.objects.filter(at__gte=since).values_list(
        "model", "stream", "latency_ms", "ttfb_ms"
    ):
        totals[(model or "(unresolved)", stream)].append(ms / 1000)
        if stream and first is not None:
            firsts[model or "(unresolved)"].append(first / 1000)
    for (model, stream), values in sorted(totals.items()):
        for q in QUANTILES:
            latency.add_metric([model, "true" if stream else "false", str(q)], _quantile(values, q))
    for model, values in sorted(firsts.items()):
        for q in QUANTILES:
            ttfb.add_metric([model, str(q)], _quantile(values, q))
    yield from (latency, ttfb)


def _budgets() -> Metric:
    """What each budget has spent of its amount in the current period, and what is reserved in flight.

    One series per budget (an organisation, a team or a key prefix: rows an
    operator made, so bounded), for an alert on a budget near its end.
    """
    family = GaugeMetricFamily(
        "llmgw_gateway_budget_used_ratio",
        "Spent plus reserved over the amount of each budget, this period (1: nothing left).",
        labels=["scope", "name"],
    )
    now = timezone.now()
    for budget in Budget.objects.select_related("org", "team", "key").order_by("scope", "id"):
        used = spent_now(budget, now) + max(budget.reserved_micros, 0)
        ratio = used / budget.amount_micros if budget.amount_micros else 1.0
        family.add_metric([budget.scope, budget.owner_name], ratio)
    return family
