from django.apps import AppConfig


class CatalogConfig(AppConfig):
    name = "catalog"
    verbose_name = "Catalog"

    def ready(self) -> None:
        from django.db.models.signals import post_save

        from catalog.models import CatalogModel
        from catalog.weights import model_saved

        # A model that refers to weights asked to be collected cancels their deletion.
        post_save.connect(model_saved, sender=CatalogModel, dispatch_uid="catalog.weights.model_saved")
