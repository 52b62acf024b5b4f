from django.apps import AppConfig
from django.db.models.signals import post_migrate


class CoreConfig(AppConfig):
    name = "core"
    label = "core"
    verbose_name = "Control plane"

    def ready(self) -> None:
        from core.roles import after_migrate

        post_migrate.connect(after_migrate, sender=self, dispatch_uid="llmgw-roles")
