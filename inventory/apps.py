from django.apps import AppConfig


class InventoryConfig(AppConfig):
    name = "inventory"
    verbose_name = "Inventory"

    def ready(self) -> None:
        """Register the settings check (``inventory.checks``)."""
        from inventory import checks  # noqa: F401 - checks registers itself
