from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied, ValidationError

from core.credentials import hash_token, hint, may_issue_token, new_token
from core.models import ApiToken, AuditEntry, Finding, TaskRun


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    """API tokens, minted here or by ``llmgw token create``.

    A token acts with its owner's powers, so who may mint for whom follows
    ``may_issue_token``: a staff user who is no superuser is offered only
    accounts that are not superusers, is refused one who holds a permission
    they lack, cannot move a token onto another account once minted (the
    owner is fixed at creation), and cannot change such an account's tokens.
    """

    list_display = ["name", "user", "hint", "read_only", "created_at", "last_used_at", "revoked_at"]
    list_filter = ["read_only", ("revoked_at", admin.EmptyFieldListFilter)]
    list_select_related = ["user"]
    search_fields = ["name", "user__username", "hint"]
    readonly_fields = ["hint", "created_at", "last_used_at"]
    fields = ["user", "name", "read_only", "hint", "created_at", "last_used_at", "revoked_at"]

    def get_readonly_fields(self, request, obj=None):
        # Re-assigning a token whose secret one holds is minting for the new owner.
        return [*self.readonly_fields, "user"] if obj is not None else self.readonly_fields

    def formfield_for_foreignkey(self, db_field, request, **kwargs):
        if db_field.name == "user" and not request.user.is_superuser:
            kwargs["queryset"] = db_field.related_model._default_manager.filter(is_superuser=False)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def get_form(self, request, obj=None, **kwargs):
        form = super().get_form(request, obj, **kwargs)
        if obj is not None:
            return form  # the owner is read-only once minted

        class OwnerChecked(form):
            def clean_user(self):
                owner = self.cleaned_data["user"]
                if refusal := may_issue_token(request.user, owner):
                    raise ValidationError(refusal)
                return owner

        return OwnerChecked

    def has_change_permission(self, request, obj=None):
        if obj is not None and may_issue_token(request.user, obj.user):
            return False
        return super().has_change_permission(request, obj)

    def save_model(self, request, obj, form, change):
        # The form offers only allowed owners; this is the rule itself, for any other way in.
        if refusal := may_issue_token(request.user, obj.user):
            raise PermissionDenied(refusal)
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
