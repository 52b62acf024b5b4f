"""URLs of the admin listener."""

from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularJSONAPIView

from core.auth import DoorPermission
from dashboard.static_files import static_file
from observability.health import healthz
from observability.metrics import metrics_view

admin.site.site_header = "llmgw"
admin.site.site_title = "llmgw"
admin.site.index_title = "Fleet administration"

urlpatterns = [
    path("healthz", healthz, name="healthz"),
    path("metrics", metrics_view, name="metrics"),
    path("static/<path:path>", static_file, name="static"),
    path("admin/", admin.site.urls),
    path("api/v1/agent/", include("agentapi.urls")),
    path("api/v1/schema", SpectacularJSONAPIView.as_view(permission_classes=[DoorPermission]), name="api-schema"),
    # The admin API proper; after the agent endpoints and the schema, since it ends in a catch-all.
    path("api/v1/", include("api.urls")),
]
