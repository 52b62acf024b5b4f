"""The gateway in the Django admin: tenancy, keys, prices, budgets, and usage to read."""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.core.paginator import Paginator
from django.db import transaction
from django.db.models import Count, Q
from django.utils import timezone
from django.utils.functional import cached_property

from core.credentials import hash_token
from core.models import AuditEntry
from gateway.models import ApiKey, Budget, Lease, Organisation, Price, SetAsideUsage, Team, UsageHour, UsageRecord
from gateway.writes import keys
from gateway.writes.budgets import spent_now


class NoCountPaginator(Paginator):
    """Never counts the table: usage grows by a row per request, and COUNT(*) on it is slow.

    It reads one row past the page asked for, so the page links reach one
    page further while rows remain.
    """

    def __init__(self, *args, page_number: int = 1, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.page_number = max(1, page_number)

    @cached_property
    def count(self) -> int:
        offset = (self.page_number - 1) * self.per_page
        return offset + len(self.object_list[offset : offset + self.per_page + 1])


def _audit(request, action: str, target: str, **detail) -> None:
    AuditEntry.record(request.user.get_username(), action, target, detail)


@admin.register(Organisation)
class OrganisationAdmin(admin.ModelAdmin):
    list_display = ["name", "team_count", "created_at"]
    search_fields = ["name"]

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(teams_n=Count("teams"))

    @admin.display(description="teams", ordering="teams_n")
    def team_count(self, obj) -> int:
        return obj.teams_n


@admin.register(Team)
class TeamAdmin(admin.ModelAdmin):
    list_display = ["name", "org", "active_keys", "rpm", "tpm"]
    list_filter = ["org"]
    list_select_related = ["org"]
    search_fields = ["name", "org__name"]

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(active_n=Count("keys", filter=Q(keys__revoked_at__isnull=True)))

    @admin.display(description="active keys", ordering="active_n")
    def active_keys(self, obj) -> int:
        return obj.active_n


class ApiKeyForm(forms.ModelForm):
    class Meta:
        model = ApiKey
        fields = ["team", "name", "allowed_models", "rpm", "tpm"]

    def clean_allowed_models(self):
        """Stored as gateway.writes.keys reads it: a list of names, or empty for every model."""
        try:
            return keys.models_for_storage(self.cleaned_data.get("allowed_models"))
        except keys.KeyRefused as refused:
            raise forms.ValidationError(refused.message) from None


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    form = ApiKeyForm
    list_display = ["prefix", "name", "team", "org", "allowed_models", "rpm", "tpm", "created_at", "revoked_at"]
    list_filter = [("revoked_at", admin.EmptyFieldListFilter), "team__org", "team"]
    list_select_related = ["team__org"]
    search_fields = ["prefix", "name", "team__name", "id"]
    readonly_fields = ["id", "prefix", "created_at", "revoked_at"]
    fields = ["id", "prefix", "team", "name", "allowed_models", "rpm", "tpm", "created_at", "revoked_at"]
    actions = ["revoke"]

    @admin.display(description="organisation", ordering="team__org__name")
    def org(self, obj) -> str:
        return obj.team.org.name

    def save_model(self, request, obj, form, change):
        if not change:
            secret = keys.new_key()
            obj.prefix, obj.digest = secret[: keys.PREFIX_CHARS], hash_token(secret)
            messages.warning(request, f"The new key is {secret} — copy it now: it is not shown again.")
        super().save_model(request, obj, form, change)
        _audit(request, "key.change" if change else "key.create", obj.prefix, id=obj.id)

    @admin.action(description="Revoke the selected keys (at once, on every gateway)")
    def revoke(self, request, queryset):
        revoked = queryset.filter(revoked_at__isnull=True)
        for key in revoked:
            _audit(request, "key.revoke", key.prefix, id=key.id)
        count = revoked.update(revoked_at=timezone.now())
        messages.success(request, f"Revoked {count} key(s).")


@admin.register(Price)
class PriceAdmin(admin.ModelAdmin):
    list_display = ["priced", "prompt_micros_per_million", "completion_micros_per_million"]
    list_select_related = ["model", "adapter"]
    search_fields = ["model__name", "adapter__name"]
    fields = [("model", "adapter"), "prompt_micros_per_million", "completion_micros_per_million"]


@admin.register(Budget)
class BudgetAdmin(admin.ModelAdmin):
    list_display = ["scope", "owner", "amount_micros", "period", "spent", "reserved_micros"]
    list_filter = ["scope", "period"]
    list_select_related = ["org", "team", "key"]
    readonly_fields = ["spent_micros", "reserved_micros", "period_start"]
    actions = ["clear_reservations"]

    @admin.display(description="for")
    def owner(self, obj) -> str:
        return obj.owner_name

    @admin.display(description="spent this period")
    def spent(self, obj) -> int:
        return spent_now(obj, timezone.now())

    @admin.action(description="Clear reservations (only when no gateway has requests in flight)")
    def clear_reservations(self, request, queryset):
        # The reaper returns a dead gateway's reservations within its lease
        # (gateway.writes.leases); this returns them at once. The leases go too, so
        # the reaper does not hold them again and a settlement gives nothing back twice.
        # Budgets first, then leases: the order every writer of both takes them in.
        with transaction.atomic():
            count = queryset.update(reserved_micros=0)
            Lease.objects.filter(budget__in=queryset).delete()
        messages.success(request, f"Cleared the reservations of {count} budget(s).")


class ReadOnly(admin.ModelAdmin):
    paginator = NoCountPaginator
    show_full_result_count = False

    def get_paginator(self, request, queryset, per_page, orphans=0, allow_empty_first_page=True):
        try:
            page = int(request.GET.get("p", 1))
        except ValueError:
            page = 1
        return self.paginator(queryset, per_page, orphans, allow_empty_first_page, page_number=page)

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(UsageRecord)
class UsageRecordAdmin(ReadOnly):
    list_display = [
        "at",
        "key",
        "requested",
        "model",
        "replica_id",
        "status",
        "outcome",
        "prompt_tokens",
        "completion_tokens",
        "counted_by",
        "cost_micros",
        "latency_ms",
    ]
    list_filter = ["status", "outcome", "counted_by", "clamped", "stream", "endpoint"]
    list_select_related = ["key"]
    search_fields = ["key__prefix", "model", "requested", "replica_id"]
    date_hierarchy = "at"


@admin.register(UsageHour)
class UsageHourAdmin(ReadOnly):
    list_display = ["hour", "key", "model", "requests", "errors", "prompt_tokens", "completion_tokens", "cost_micros"]
    list_select_related = ["key"]
    search_fields = ["key__prefix", "model"]
    date_hierarchy = "hour"


@admin.register(SetAsideUsage)
class SetAsideUsageAdmin(ReadOnly):
    list_display = ["at", "reason"]
    search_fields = ["reason", "record"]
    date_hierarchy = "at"
