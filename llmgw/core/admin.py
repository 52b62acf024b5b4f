from django.contrib import admin, messages

from llmgw.core.models import ApiToken, AuditEntry, Finding, TaskRun
from llmgw.core.tokens import hash_token, hint, new_token


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ["name", "user", "hint", "read_only", "created_at", "last_used_at", "revoked_at"]
    list_filter = ["read_only", ("revoked_at", admin.EmptyFieldListFilter)]
    list_select_related = ["user"]
    search_fields = ["name", "user__username", "hint"]
    readonly_fields = ["hint", "created_at", "last_used_at"]
    fields = ["user", "name", "read_only", "hint", "created_at", "last_used_at", "revoked_at"]

    def save_model(self, request, obj, form, change):
        if not change:
            secret = new_token("llmgw_adm")
            obj.digest, obj.hint = hash_token(secret), hint(secret)
            messages.warning(request, f"The new token is {secret} — copy it now: it is not shown again.")
        super().save_model(request, obj, form, change)


@admin.register(AuditEntry)
class AuditEntryAdmin(admin.ModelAdmin):
    list_display = ["at", "actor", "action", "target"]
    list_filter = ["action"]
    search_fields = ["actor", "target"]
    date_hierarchy = "at"
    show_full_result_count = False

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(TaskRun)
class TaskRunAdmin(admin.ModelAdmin):
    list_display = ["name", "last_started", "last_finished", "last_ok", "runs"]
    readonly_fields = [f.name for f in TaskRun._meta.fields]

    def has_add_permission(self, request):
        return False


class OpenListFilter(admin.SimpleListFilter):
    title = "open"
    parameter_name = "open"

    def lookups(self, request, model_admin):
        return [("yes", "open"), ("no", "resolved")]

    def queryset(self, request, queryset):
        if self.value() == "yes":
            return queryset.filter(resolved_at__isnull=True)
        if self.value() == "no":
            return queryset.filter(resolved_at__isnull=False)
        return queryset


@admin.register(Finding)
class FindingAdmin(admin.ModelAdmin):
    """Written by the doctor sweeps only: a finding resolves when its cause clears, not by hand."""

    list_display = ["kind", "subject", "severity", "first_seen", "last_seen", "resolved_at"]
    list_filter = [OpenListFilter, "severity", "kind"]
    search_fields = ["subject", "message"]
    date_hierarchy = "first_seen"
    show_full_result_count = False
    readonly_fields = [f.name for f in Finding._meta.fields]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False
