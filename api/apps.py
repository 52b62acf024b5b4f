from django.apps import AppConfig


class ApiConfig(AppConfig):
    name = "api"
    label = "api"
    verbose_name = "admin API"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from api import schema  # noqa: F401 - registers the bearer scheme with drf-spectacular
