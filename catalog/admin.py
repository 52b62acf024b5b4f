"""The catalog in the admin: where operators add and edit models.

A model declared in the configuration file is shown read-only: the file is
its source of truth, and an edit here would be overwritten at the next read.
"""

from django.contrib import admin

from catalog.models import Adapter, Alias, CapacityMeasurement, CatalogModel, Fallback, Profile


class FileDeclaredReadOnly:
    """Inlines and pages of a file-declared model show but do not change."""

    def _editable(self, obj) -> bool:
        return obj is None or not getattr(obj, "read_only", False)

    def has_change_permission(self, request, obj=None):
        return self._editable(obj) and super().has_change_permission(request, obj)

    def has_delete_permission(self, request, obj=None):
        return self._editable(obj) and super().has_delete_permission(request, obj)

    def has_add_permission(self, request, obj=None):
        if obj is not None and not self._editable(obj):
            return False
        return (
            super().has_add_permission(request, obj)
            if isinstance(self, admin.options.InlineModelAdmin)
            else super().has_add_permission(request)
        )


class ProfileInline(FileDeclaredReadOnly, admin.StackedInline):
    model = Profile
    extra = 0
    fields = [
        ("name", "position", "engine"),
        ("gpu_class", "memory_gb", "pool"),
        ("gpus", "nodes", "tp", "pp"),
        "engine_args",
        "env",
        "fingerprint",
    ]
    readonly_fields = ["fingerprint"]


class AliasInline(FileDeclaredReadOnly, admin.TabularInline):
    model = Alias
    extra = 0


class AdapterInline(FileDeclaredReadOnly, admin.TabularInline):
    """LoRA adapters on the model; each name is checked against every model, alias and adapter (Adapter.clean)."""

    model = Adapter
    extra = 0
    fields = ["name", "source"]


class FallbackInline(FileDeclaredReadOnly, admin.TabularInline):
    model = Fallback
    fk_name = "model"
    extra = 0
    fields = ["position", "target"]


@admin.register(CatalogModel)
class CatalogModelAdmin(FileDeclaredReadOnly, admin.ModelAdmin):
    list_display = ["name", "min_replicas", "max_replicas", "idle_timeout", "declared_in", "updated_at"]
    list_filter = ["declared_in"]
    search_fields = ["name", "description", "aliases__name", "adapters__name", "source"]
    inlines = [ProfileInline, AliasInline, AdapterInline, FallbackInline]
    fields = ["name", "description", "source", ("min_replicas", "max_replicas", "idle_timeout"), "declared_in"]
    readonly_fields = ["declared_in"]


@admin.register(CapacityMeasurement)
class CapacityMeasurementAdmin(admin.ModelAdmin):
    list_display = ["model_name", "profile_name", "measured_at", "measured_by"]
    search_fields = ["model_name", "profile_name"]
