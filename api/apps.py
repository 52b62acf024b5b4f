from django.apps import AppConfig


class ApiConfig(AppConfig):
    name = "api"
    label = "api"
    verbose_name = "admin API"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.db.models.signals import post_save

        from api import schema  # noqa: F401 - registers the bearer scheme with drf-spectacular
        from catalog.models import CatalogModel
        from catalog.weights import model_saved

        # A model that refers to weights asked to be collected cancels their deletion.
        post_save.connect(model_saved, sender=CatalogModel, dispatch_uid="api.weights.model_saved")
