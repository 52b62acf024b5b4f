from django.apps import AppConfig


class CoreConfig(AppConfig):
    name = "llmgw.core"
    label = "core"
    verbose_name = "Control plane"
