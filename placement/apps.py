from django.apps import AppConfig


class PlacementConfig(AppConfig):
    name = "placement"
    verbose_name = "Placement"

    def ready(self) -> None:
        from inventory.signals import heartbeat_answers_wanted, heartbeats_flushed
        from placement import assignments, shard_status

        # The heartbeat answers hand out each node's shards; what the beats say about them moves replicas.
        heartbeat_answers_wanted.connect(
            assignments.heartbeat_tables, dispatch_uid="placement.assignments.heartbeat_tables"
        )
        heartbeats_flushed.connect(shard_status.follow_flush, dispatch_uid="placement.shard_status.follow_flush")
