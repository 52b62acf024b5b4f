from django.apps import AppConfig


class PlacementConfig(AppConfig):
    name = "placement"
    verbose_name = "Placement"

    def ready(self) -> None:
        """Listen to the apps below: they tell placement what changed through signals they declare."""
        from catalog.signals import model_changed
        from inventory.signals import (
            card_holds_changed,
            heartbeat_answers_wanted,
            heartbeats_flushed,
            node_state_changed,
        )
        from placement import assignments, checks, signals  # noqa: F401 - checks registers itself
        from placement.writes import shard_status

        model_changed.connect(signals.on_model_changed, dispatch_uid="placement.on_model_changed")
        node_state_changed.connect(signals.on_node_state_changed, dispatch_uid="placement.on_node_state_changed")
        card_holds_changed.connect(signals.on_node_state_changed, dispatch_uid="placement.on_card_holds_changed")
        # The heartbeat answers hand out each node's shards; what the beats say about them moves replicas.
        heartbeat_answers_wanted.connect(
            assignments.heartbeat_tables, dispatch_uid="placement.assignments.heartbeat_tables"
        )
        heartbeats_flushed.connect(shard_status.follow_flush, dispatch_uid="placement.writes.shard_status.follow_flush")
