"""Inventory in the admin: readable, filterable, searchable; written only by agents.

Operators change a node's state (cordon, drain) and a domain's name here; the
rest is what the agents reported and is not theirs to edit.
"""

from django.contrib import admin, messages

from core.credentials import hash_token, hint, new_token
from inventory.models import GPU, IBPort, JoinToken, Node, NVLinkDomain, SubnetManagerChange


class ReadOnlyAdmin(admin.ModelAdmin):
    """Everything shown, nothing editable except ``editable_fields``."""

    editable_fields: tuple[str, ...] = ()

    def get_readonly_fields(self, request, obj=None):
        return [f.name for f in self.model._meta.fields if f.name not in self.editable_fields]

    def has_add_permission(self, request):
        return False


class GPUInline(admin.TabularInline):
    model = GPU
    fields = ["index", "name", "gpu_class", "memory_mb", "numa", "fabric_state", "domain", "mig_profile", "health"]
    readonly_fields = fields
    extra = 0
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request, obj=None):
        return False


class IBPortInline(admin.TabularInline):
    model = IBPort
    fields = ["hca", "port", "state", "rate_gbps", "link_layer", "sm_guid", "fabric"]
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Node)
class NodeAdmin(ReadOnlyAdmin):
    editable_fields = ("state", "labels")
    list_display = ["name", "hostname", "state", "reachable", "arch", "agent_version", "last_seen"]
    list_filter = ["state", "reachable", "arch", "imex_state"]
    search_fields = ["name", "hostname", "mgmt_addr", "gpus__uuid"]
    inlines = [GPUInline, IBPortInline]
    exclude = ["credential_digest", "report_digest"]
    show_full_result_count = False


@admin.register(GPU)
class GPUAdmin(ReadOnlyAdmin):
    list_display = ["__str__", "name", "gpu_class", "memory_mb", "fabric_state", "domain", "mig_mode"]
    list_filter = ["gpu_class", "fabric_state", "domain", "mig_mode"]
    list_select_related = ["node", "domain"]
    search_fields = ["uuid", "mig_uuid", "node__name", "node__hostname", "pci_bus"]
    show_full_result_count = False


@admin.register(NVLinkDomain)
class NVLinkDomainAdmin(ReadOnlyAdmin):
    editable_fields = ("name",)
    list_display = ["__str__", "cluster_uuid", "clique_id", "first_seen"]
    search_fields = ["name", "cluster_uuid"]


@admin.register(IBPort)
class IBPortAdmin(ReadOnlyAdmin):
    list_display = ["__str__", "state", "phys_state", "rate_gbps", "link_layer", "sm_guid", "fabric"]
    list_filter = ["state", "link_layer", "fabric"]
    list_select_related = ["node"]
    search_fields = ["node__name", "node_guid", "port_guid", "sm_guid"]


@admin.register(SubnetManagerChange)
class SubnetManagerChangeAdmin(ReadOnlyAdmin):
    list_display = ["at", "node", "hca", "port", "old_sm_guid", "new_sm_guid"]
    list_select_related = ["node"]
    search_fields = ["node__name", "old_sm_guid", "new_sm_guid"]


@admin.register(JoinToken)
class JoinTokenAdmin(admin.ModelAdmin):
    list_display = ["name", "hint", "created_at", "revoked_at"]
    readonly_fields = ["hint", "created_at"]
    fields = ["name", "hint", "created_at", "revoked_at"]

    def save_model(self, request, obj, form, change):
        if not change:
            secret = new_token("llmgw_join")
            obj.digest, obj.hint = hash_token(secret), hint(secret)
            messages.warning(request, f"The new join token is {secret} — copy it now: it is not shown again.")
        super().save_model(request, obj, form, change)
