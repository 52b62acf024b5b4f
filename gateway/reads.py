"""What the API and the admin show of keys, budgets and usage: one function each.

``usage_by_scope`` reads the hourly roll-up for the whole hours of the
window and the raw records only for the part-hour at its start, so a window
of a month costs the same few queries as one of an hour, and is exact.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import Count, Max, Q, Sum
from django.utils import timezone

from gateway.models import ApiKey, Budget, Organisation, Scope, Team, UsageHour, UsageRecord
from gateway.writes.budgets import spent_now
from gateway.writes.usage import CLIENT_CLOSED

UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd])")


def parse_duration(text: str) -> timedelta | None:
    """``24h``, ``90m``, ``1h30m``, ``7d``; None when it is not a positive duration."""
    text = (text or "").strip()
    if not text or DURATION.sub("", text):
        return None
    seconds = sum(float(n) * UNITS[u] for n, u in DURATION.findall(text))
    return timedelta(seconds=seconds) if seconds > 0 else None


def key_view(key: ApiKey) -> dict:
    return {
        "id": key.id,
        "prefix": key.prefix,
        "name": key.name,
        "team": key.team.name,
        "org": key.team.org.name,
        "models": key.allowed_models,
        "created_at": key.created_at.isoformat(),
        "revoked_at": key.revoked_at.isoformat() if key.revoked_at else None,
    }


def keys() -> list[dict]:
    return [key_view(k) for k in ApiKey.objects.select_related("team__org").order_by("-created_at")]


def budget_view(budget: Budget, now: datetime | None = None) -> dict:
    return {
        "scope": budget.scope,
        "name": budget.owner_name,
        "amount_micros": budget.amount_micros,
        "period": budget.period,
        "spent_micros": spent_now(budget, now or timezone.now()),
        "reserved_micros": budget.reserved_micros,
    }


def budgets() -> list[dict]:
    now = timezone.now()
    return [budget_view(b, now) for b in Budget.objects.select_related("org", "team", "key").order_by("scope", "id")]


@dataclass
class Sums:
    requests: int = 0
    errors: int = 0
    prompt: int = 0
    completion: int = 0
    cost: int = 0
    last_at: datetime | None = None

    def add(self, other: Sums) -> None:
        self.requests += other.requests
        self.errors += other.errors
        self.prompt += other.prompt
        self.completion += other.completion
        self.cost += other.cost
        if other.last_at and (self.last_at is None or other.last_at > self.last_at):
            self.last_at = other.last_at


def usage_by_key(since: datetime, now: datetime) -> dict[str, Sums]:
    first_hour = since.replace(minute=0, second=0, microsecond=0)
    if first_hour < since:
        first_hour += timedelta(hours=1)
    out: dict[str, Sums] = {}
    hours = (
        UsageHour.objects.filter(hour__gte=first_hour)
        .values("key_id")
        .annotate(
            r=Sum("requests"),
            e=Sum("errors"),
            p=Sum("prompt_tokens"),
            c=Sum("completion_tokens"),
            m=Sum("cost_micros"),
            last=Max("last_at"),
        )
    )
    records = (
        UsageRecord.objects.filter(at__gte=since, at__lt=min(first_hour, now + timedelta(seconds=1)))
        .values("key_id")
        .annotate(
            r=Count("id"),
            e=Count("id", filter=Q(status__gte=400) & ~Q(status=CLIENT_CLOSED)),
            p=Sum("prompt_tokens"),
            c=Sum("completion_tokens"),
            m=Sum("cost_micros"),
            last=Max("at"),
        )
    )
    for row in [*hours, *records]:
        out.setdefault(row["key_id"], Sums()).add(
            Sums(row["r"] or 0, row["e"] or 0, row["p"] or 0, row["c"] or 0, row["m"] or 0, row["last"])
        )
    return out


def _view(scope: str, ident: str, name: str, keys_count: int, sums: Sums, budget: Budget | None, now) -> dict:
    view = {
        "scope": scope,
        "id": ident,
        "name": name,
        "keys": keys_count,
        "requests": sums.requests,
        "prompt_tokens": sums.prompt,
        "completion_tokens": sums.completion,
        "cost_micros": sums.cost,
        "errors": sums.errors,
    }
    if sums.last_at:
        view["last_at"] = sums.last_at.isoformat()
    # Only the budget this level sets: a parent's budget reported against
    # each child would read as though each had that much.
    if budget is not None:
        view["budget_micros"] = budget.amount_micros
        view["budget_period"] = budget.period
        if budget.amount_micros:
            view["fraction"] = spent_now(budget, now) / budget.amount_micros
    return view


def usage_by_scope(scope: str, since: timedelta, now: datetime | None = None) -> list[dict]:
    """One ScopeUsageView per organisation, team or key (``scope``), as in the seeds."""
    now = now or timezone.now()
    per_key = usage_by_key(now - since, now)
    keys = list(ApiKey.objects.select_related("team__org").filter(Q(revoked_at__isnull=True) | Q(id__in=per_key)))
    budgets = {(b.scope, b.org_id or b.team_id or b.key_id): b for b in Budget.objects.all()}
    if scope == Scope.KEY:
        return [
            _view("key", k.id, k.name or k.prefix, 1, per_key.get(k.id, Sums()), budgets.get(("key", k.id)), now)
            for k in keys
        ]
    groups: dict[int, tuple[Sums, set]] = {}
    for k in keys:
        group = k.team_id if scope == Scope.TEAM else k.team.org_id
        sums, members = groups.setdefault(group, (Sums(), set()))
        sums.add(per_key.get(k.id, Sums()))
        if k.revoked_at is None:
            members.add(k.id)
    owners = Team.objects.order_by("name") if scope == Scope.TEAM else Organisation.objects.order_by("name")
    out = []
    for owner in owners:
        sums, members = groups.get(owner.id, (Sums(), set()))
        out.append(_view(scope, str(owner.id), owner.name, len(members), sums, budgets.get((scope, owner.id)), now))
    return out
