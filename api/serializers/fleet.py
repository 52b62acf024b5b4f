from rest_framework import serializers as s

from api.serializers.common import DeviceCountSerializer


class NodeTotalsSerializer(s.Serializer):
    total = s.IntegerField()
    ready = s.IntegerField()
    cordoned = s.IntegerField()
    draining = s.IntegerField()
    unreachable = s.IntegerField(help_text="Counted here whatever its operator state.")


class FabricUseSerializer(s.Serializer):
    fabric = s.CharField()
    nodes = s.IntegerField()
    nodes_with_weights = s.IntegerField()
    models_present = s.IntegerField(help_text="Distinct models on disk across the fabric's nodes.")
    largest_free_block = s.IntegerField(help_text="Nodes entirely free: what decides if a multi-node replica lands.")


class ReplicaTotalsSerializer(s.Serializer):
    total = s.IntegerField()
    ready = s.IntegerField()
    starting = s.IntegerField(help_text="Pending or starting.")
    stopping = s.IntegerField()
    failed = s.IntegerField()
    fetching = s.IntegerField(help_text="Replicas with a download in flight.")
    stale = s.IntegerField(help_text="Placed under a profile definition since edited.")


class ModelTotalsSerializer(s.Serializer):
    total = s.IntegerField()
    satisfied = s.IntegerField()
    short = s.IntegerField()


class IdleReplicaSerializer(s.Serializer):
    id = s.CharField()
    model = s.CharField()
    idle_seconds = s.IntegerField()
    gpus = s.IntegerField()


class ParkedModelSerializer(s.Serializer):
    model = s.CharField()
    failures = s.IntegerField()
    reason = s.CharField(allow_blank=True)


class StoreMemberSerializer(s.Serializer):
    name = s.CharField(allow_blank=True)
    host = s.CharField(allow_blank=True)
    role = s.CharField(allow_blank=True)
    state = s.CharField(allow_blank=True)
    lag = s.IntegerField(help_text="Bytes behind the leader; 0 for the leader, -1 unknown.")


class PartitionSerializer(s.Serializer):
    group = s.CharField(help_text='"the fleet", "fabric <name>" or "<label>=<value>" (a rack).')
    nodes = s.ListField(child=s.CharField(), help_text="The nodes that went silent together.")
    members = s.IntegerField(help_text="How many nodes the group had.")
    since = s.DateTimeField(help_text="When the first of them went silent.")
    until = s.DateTimeField(
        allow_null=True,
        help_text="When those still silent become lost and their replicas move at the normal rate "
        "(LLMGW_PARTITION_HOLD_S after since); null: it holds until they answer or an operator resumes "
        "(a partition of the whole fleet).",
    )


class ResumeMovesSerializer(s.Serializer):
    resumed = PartitionSerializer(many=True, help_text="The partitions this ended; empty when none was open.")


class SummarySerializer(s.Serializer):
    """The whole fleet in one answer."""

    nodes = NodeTotalsSerializer()
    gpus = DeviceCountSerializer(many=True, help_text="By class; free counts only ready, reachable nodes.")
    fabrics = FabricUseSerializer(many=True)
    replicas = ReplicaTotalsSerializer()
    models = ModelTotalsSerializer()
    unplaceable = s.ListField(child=s.CharField(), help_text="Models short of replicas that cannot be placed.")
    parked = ParkedModelSerializer(many=True)
    partitions = PartitionSerializer(
        many=True, help_text="Groups partitioned now: nothing on their nodes is moved until they answer or resume."
    )
    idle_replicas = IdleReplicaSerializer(many=True)
    store = StoreMemberSerializer(many=True, required=False, help_text="Absent: the store is not replicated.")
    store_error = s.CharField(required=False)
