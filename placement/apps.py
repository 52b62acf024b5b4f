from django.apps import AppConfig


class PlacementConfig(AppConfig):
    name = "placement"
    verbose_name = "Placement"

    def ready(self) -> None:
        """Listen to the apps below: they tell placement what changed through signals they declare."""
        from catalog.signals import model_changed
        from inventory.signals import node_state_changed
        from placement import signals

        model_changed.connect(signals.on_model_changed, dispatch_uid="placement.on_model_changed")
        node_state_changed.connect(signals.on_node_state_changed, dispatch_uid="placement.on_node_state_changed")
