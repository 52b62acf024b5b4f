"""Admin API for keys, budgets and usage (``/api/v1/keys|budgets|usage``), read by ``llmgw ctl``.

Thin: every answer is built by gateway.reads, which the admin uses too.
The views stand on the admin API's one base (api.base.ApiView), like every
other module here: the same body limit, JSON reader, read-only rule and
audit rows (actor, account, token); routed in api.urls. Every field is
checked against the column it lands in (api.columns) before anything is
written, and each change is written with its audit row in one transaction.
"""

from __future__ import annotations

from datetime import timedelta

from django.db import transaction
from rest_framework.response import Response

from api import columns
from api.base import ApiView, Refused
from catalog.models import CatalogModel
from core.columns import field as column
from gateway import reads as reports
from gateway.models import ApiKey, Budget, Organisation, Period, Scope, Team
from gateway.writes import budgets, keys

# Further back than any usage is kept, and well inside what a date can hold: a window
# of a billion days is a typo, and subtracting it from now would overflow.
LONGEST_WINDOW = timedelta(days=3660)

KEY_FIELDS = ("team", "org", "models", "name")
BUDGET_FIELDS = ("scope", "name", "amount_micros", "period")


class KeysView(ApiView):
    def get(self, request):
        return Response(reports.keys())

    def post(self, request):
        data = self.body(request)
        columns.only(data, KEY_FIELDS)
        wanted = {
            "team": columns.text(
                data.get("team"), "team", column(Team, "name"), required="a key needs a team: send {'team': 'NAME'}"
            ),
            "org": columns.text(data.get("org"), "org", column(Organisation, "name")),
            "models": columns.texts(data.get("models"), "models", column(CatalogModel, "name"), what="model names"),
            "name": columns.text(data.get("name"), "name", column(ApiKey, "name")) or "",
        }
        # One transaction: a key whose audit row failed must not outlive the answer
        # that would have shown its secret, since nobody could ever use it.
        with transaction.atomic():
            try:
                issued = keys.issue(**wanted)
            except keys.KeyRefused as refusal:
                raise Refused(refusal.status, refusal.message) from None
            self.audit(request, "key.create", issued.key.prefix, id=issued.key.id, team=issued.key.team.name)
        view = reports.key_view(issued.key)
        view["key"] = issued.secret
        return Response(view, status=201)


class RevokeView(ApiView):
    def post(self, request, key_id: str):
        with transaction.atomic():
            key = _key(key_id)
            if key is None:
                raise Refused(404, f"no key with id or prefix {key_id!r}")
            already = key.revoked_at is not None
            keys.revoke(key)
            if not already:
                self.audit(request, "key.revoke", key.prefix, id=key.id)
        return Response({"id": key.id, "revoked_at": key.revoked_at.isoformat()})


def _key(name: str) -> ApiKey | None:
    return ApiKey.objects.filter(pk=name).first() or ApiKey.objects.filter(prefix=name).first()


OWNER_NAME = {Scope.ORG: (Organisation, "name"), Scope.TEAM: (Team, "name"), Scope.KEY: (ApiKey, "id")}


def owner(scope: str, name: str) -> dict:
    """The budget's owner as model fields (``{"team": team}``); a 404 when there is none."""
    if scope == Scope.ORG:
        found = Organisation.objects.filter(name=name).first()
    elif scope == Scope.TEAM:
        found = Team.objects.filter(name=name).first()
    else:
        found = _key(name)
    if found is None:
        label = {"org": "organisation", "team": "team", "key": "key (id or prefix)"}[scope]
        raise Refused(404, f"no {label} named {name!r}")
    return {scope: found}


class BudgetsView(ApiView):
    def get(self, request):
        return Response(reports.budgets())

    def put(self, request):
        data = self.body(request)
        columns.only(data, BUDGET_FIELDS)
        scope = columns.choice(data.get("scope"), "scope", Scope.values)
        name = columns.text(data.get("name"), "name", column(*OWNER_NAME[scope]), required=True)
        amount = columns.whole(
            data.get("amount_micros"), "amount_micros", column(Budget, "amount_micros"), required=True, unit="micros"
        )
        if amount > budgets.MAX_MICROS:
            raise columns.refuse("amount_micros", f"must be at most {budgets.MAX_MICROS} micros (got {amount})")
        period = columns.choice(data.get("period"), "period", Period.values, default=Period.MONTH)
        with transaction.atomic():
            fields = owner(scope, name)
            budget, created = Budget.objects.select_for_update().get_or_create(
                **fields, defaults={"scope": scope, "amount_micros": amount, "period": period}
            )
            if not created:
                Budget.objects.filter(pk=budget.pk).update(amount_micros=amount, period=period)
                budget.refresh_from_db()
            self.audit(request, "budget.set", f"{scope} {name}", amount_micros=amount, period=period)
        return Response(reports.budget_view(budget))


class UsageView(ApiView):
    def get(self, request):
        by = request.query_params.get("by") or Scope.TEAM
        if by not in Scope.values:
            raise Refused(400, "by must be org, team or key")
        try:
            since = reports.parse_duration(request.query_params.get("since") or "24h")
        except OverflowError:
            since = LONGEST_WINDOW * 2
        if since is None:
            raise Refused(400, "since must be a positive duration, like 24h, 90m or 7d")
        if since > LONGEST_WINDOW:
            raise Refused(400, f"since may reach back at most {LONGEST_WINDOW.days}d")
        return Response(reports.usage_by_scope(by, since))
