from django.apps import AppConfig


class GatewayConfig(AppConfig):
    """The /v1 proxy, keys and budgets; its figures for ``/metrics`` are ``gateway.metrics``, read by observability."""

    name = "gateway"
