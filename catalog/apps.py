from django.apps import AppConfig


class CatalogConfig(AppConfig):
    name = "catalog"
    verbose_name = "Catalog"

    def ready(self) -> None:
        from django.db.models.signals import post_save

        from catalog import prefetch, weights
        from catalog.models import CatalogModel
        from inventory.signals import heartbeat_answers_wanted, heartbeats_flushed

        # A model that refers to weights asked to be collected cancels their deletion.
        post_save.connect(weights.model_saved, sender=CatalogModel, dispatch_uid="catalog.weights.model_saved")
        # The heartbeat answers hand out the deletions; the agents' reports of them settle the rows.
        heartbeat_answers_wanted.connect(weights.heartbeat_tables, dispatch_uid="catalog.weights.heartbeat_tables")
        heartbeats_flushed.connect(weights.settle_collected, dispatch_uid="catalog.weights.settle_collected")
        # The heartbeat answers hand out the prefetches; the agents' progress is stored as it comes.
        heartbeat_answers_wanted.connect(prefetch.heartbeat_tables, dispatch_uid="catalog.prefetch.heartbeat_tables")
        heartbeats_flushed.connect(prefetch.settle_prefetched, dispatch_uid="catalog.prefetch.settle_prefetched")
