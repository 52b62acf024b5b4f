"""URLs of the gateway listener: /healthz and the OpenAI-compatible /v1/ (gateway issue)."""

from django.urls import path

from llmgw.health import healthz

urlpatterns = [
    path("healthz", healthz, name="gateway-healthz"),
]
