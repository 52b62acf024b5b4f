"""Replicas and shards in the admin: what the reconciler decided, read-only."""

from django.contrib import admin

from placement.models import Demand, PlacementExplanation, Replica, Shard


class ShardInline(admin.TabularInline):
    model = Shard
    fields = ["rank", "node", "gpu_indices", "state", "fetch_done", "fetch_total", "error"]
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Replica)
class ReplicaAdmin(admin.ModelAdmin):
    list_display = [
        "id",
        "model",
        "profile_name",
        "state",
        "pool",
        "nvlink_domain",
        "endpoint",
        "created_at",
        "last_used_at",
        "stale",
    ]
    list_filter = ["state", "model", "nvlink_domain"]
    list_select_related = ["model", "nvlink_domain"]
    search_fields = ["id", "model__name", "endpoint", "shards__node__name"]
    inlines = [ShardInline]

    def get_readonly_fields(self, request, obj=None):
        # The engine key is not shown: it opens the engine to whoever reads it.
        return [f.name for f in Replica._meta.fields if f.name != "engine_key"]

    def has_add_permission(self, request):
        return False


@admin.register(Shard)
class ShardAdmin(admin.ModelAdmin):
    list_display = ["__str__", "replica", "node", "rank", "state", "fetch_done", "fetch_total"]
    list_filter = ["state"]
    list_select_related = ["replica__model", "node"]
    search_fields = ["replica__id", "node__name", "replica__model__name"]

    def get_readonly_fields(self, request, obj=None):
        return [f.name for f in Shard._meta.fields]

    def has_add_permission(self, request):
        return False


class ReadOnly(admin.ModelAdmin):
    """Written by the reconciler (or the gateway) only; the admin shows them."""

    def get_readonly_fields(self, request, obj=None):
        return [f.name for f in self.model._meta.fields]

    def has_add_permission(self, request):
        return False


@admin.register(PlacementExplanation)
class PlacementExplanationAdmin(ReadOnly):
    list_display = ["model", "placed", "computed_at", "reasons", "stale_replicas"]
    list_filter = ["placed"]
    list_select_related = ["model"]
    search_fields = ["model__name"]

    @admin.display(description="rejections")
    def reasons(self, obj: PlacementExplanation) -> int:
        return len(obj.rejections)

    @admin.display(description="stale replicas")
    def stale_replicas(self, obj: PlacementExplanation) -> str:
        return ", ".join(s.get("replica", "?") for s in obj.stale) or "-"


@admin.register(Demand)
class DemandAdmin(ReadOnly):
    list_display = ["model", "requested_at"]
    list_select_related = ["model"]
