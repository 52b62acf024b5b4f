"""Admin API for keys, budgets and usage (``/api/v1/keys|budgets|usage``), read by ``llmgw ctl``.

Thin: every answer is built by gateway.reports, which the admin uses too.
Every change is audited with the actor from ``X-Llmgw-Actor``, else the
token owner's username.
"""

from __future__ import annotations

from django.db import transaction
from django.urls import path
from rest_framework import exceptions, permissions, status
from rest_framework.response import Response
from rest_framework.views import APIView

from gateway import keys, reports
from gateway.models import ApiKey, Budget, Organisation, Period, Scope, Team
from llmgw.core.models import AuditEntry


class WritesNeedWriteToken(permissions.BasePermission):
    """A read-only API token may read everything here and change nothing."""

    message = "this token is read-only: changes need a token issued without --read-only"

    def has_permission(self, request, view) -> bool:
        if request.method in permissions.SAFE_METHODS:
            return True
        return not getattr(request.auth, "read_only", False)


class Conflict(exceptions.APIException):
    status_code = status.HTTP_409_CONFLICT


def actor(request) -> str:
    return request.headers.get("X-Llmgw-Actor") or getattr(request.user, "username", "") or "unknown"


def audit(request, action: str, target: str, **detail) -> None:
    AuditEntry.objects.create(actor=actor(request), action=action, target=target, detail=detail)


class GatewayView(APIView):
    permission_classes = [permissions.IsAuthenticated, WritesNeedWriteToken]

    def body(self, request) -> dict:
        if not isinstance(request.data, dict):
            raise exceptions.ValidationError("the body must be a JSON object")
        return request.data


class KeysView(GatewayView):
    def get(self, request):
        return Response(reports.keys())

    def post(self, request):
        data = self.body(request)
        try:
            issued = keys.issue(
                team=data.get("team"), org=data.get("org"), models=data.get("models"), name=data.get("name") or ""
            )
        except keys.KeyRefused as refusal:
            if refusal.status == 409:
                raise Conflict(refusal.message) from None
            raise exceptions.ValidationError(refusal.message) from None
        audit(request, "key.create", issued.key.prefix, id=issued.key.id, team=issued.key.team.name)
        view = reports.key_view(issued.key)
        view["key"] = issued.secret
        return Response(view, status=status.HTTP_201_CREATED)


class RevokeView(GatewayView):
    def post(self, request, key_id: str):
        key = ApiKey.objects.filter(pk=key_id).first() or ApiKey.objects.filter(prefix=key_id).first()
        if key is None:
            raise exceptions.NotFound(f"no key with id or prefix {key_id!r}")
        already = key.revoked_at is not None
        keys.revoke(key)
        if not already:
            audit(request, "key.revoke", key.prefix, id=key.id)
        return Response({"id": key.id, "revoked_at": key.revoked_at.isoformat()})


def owner(scope: str, name: str) -> dict:
    """The budget's owner as model fields (``{"team": team}``); NotFound when there is none."""
    if scope == Scope.ORG:
        found = Organisation.objects.filter(name=name).first()
    elif scope == Scope.TEAM:
        found = Team.objects.filter(name=name).first()
    else:
        found = ApiKey.objects.filter(pk=name).first() or ApiKey.objects.filter(prefix=name).first()
    if found is None:
        label = {"org": "organisation", "team": "team", "key": "key (id or prefix)"}[scope]
        raise exceptions.NotFound(f"no {label} named {name!r}")
    return {scope: found}


class BudgetsView(GatewayView):
    def get(self, request):
        return Response(reports.budgets())

    def put(self, request):
        data = self.body(request)
        scope, name = data.get("scope"), data.get("name")
        amount, period = data.get("amount_micros"), data.get("period") or Period.MONTH
        if scope not in Scope.values:
            raise exceptions.ValidationError("scope must be org, team or key")
        if not isinstance(name, str) or not name:
            raise exceptions.ValidationError(f"name the {scope} the budget is for: send 'name'")
        if isinstance(amount, bool) or not isinstance(amount, int) or amount < 0:
            raise exceptions.ValidationError("amount_micros must be a whole number of micros, 0 or more")
        if period not in Period.values:
            raise exceptions.ValidationError("period must be day, week or month")
        fields = owner(scope, name)
        with transaction.atomic():
            budget, created = Budget.objects.select_for_update().get_or_create(
                **fields, defaults={"scope": scope, "amount_micros": amount, "period": period}
            )
            if not created:
                Budget.objects.filter(pk=budget.pk).update(amount_micros=amount, period=period)
                budget.refresh_from_db()
        audit(request, "budget.set", f"{scope} {name}", amount_micros=amount, period=period)
        return Response(reports.budget_view(budget))


class UsageView(GatewayView):
    def get(self, request):
        by = request.query_params.get("by") or Scope.TEAM
        if by not in Scope.values:
            raise exceptions.ValidationError("by must be org, team or key")
        since = reports.parse_duration(request.query_params.get("since") or "24h")
        if since is None:
            raise exceptions.ValidationError("since must be a positive duration, like 24h, 90m or 7d")
        return Response(reports.usage_by_scope(by, since))


urlpatterns = [
    path("keys", KeysView.as_view(), name="gateway-keys"),
    path("keys/<str:key_id>/revoke", RevokeView.as_view(), name="gateway-key-revoke"),
    path("budgets", BudgetsView.as_view(), name="gateway-budgets"),
    path("usage", UsageView.as_view(), name="gateway-usage"),
]
