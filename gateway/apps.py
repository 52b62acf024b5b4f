from django.apps import AppConfig


class GatewayConfig(AppConfig):
    name = "gateway"

    def ready(self) -> None:
        from gateway import metrics
        from observability.metrics import register_source

        register_source("gateway", metrics.collect)
