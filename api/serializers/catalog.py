from rest_framework import serializers as s

from api.serializers.placement import AutoscaleSerializer


class ProfileSerializer(s.Serializer):
    name = s.CharField()
    engine = s.CharField()
    gpu_class = s.CharField()
    gpus = s.IntegerField()
    nodes = s.IntegerField()
    tp = s.IntegerField()
    pp = s.IntegerField()
    memory_gb = s.FloatField(required=False)
    pool = s.CharField(required=False)


class PrefetchSerializer(s.Serializer):
    node = s.CharField()
    state = s.ChoiceField(choices=["requested", "fetching", "done", "failed"])
    source = s.CharField(help_text="The model's source when asked for.")
    requested_at = s.DateTimeField()
    requested_by = s.CharField()
    bytes_done = s.IntegerField(allow_null=True)
    bytes_total = s.IntegerField(allow_null=True, help_text="Null: the source did not say.")
    done_at = s.DateTimeField(required=False)
    path = s.CharField(required=False, help_text="Where the weights are on the node, once done.")
    error = s.CharField(required=False)


class PrefetchRequestSerializer(s.Serializer):
    nodes = s.ListField(child=s.CharField(), required=False, help_text="These nodes.")
    pool = s.CharField(required=False, help_text="Every node of this pool (or, with count, some of them).")
    count = s.IntegerField(required=False, min_value=1, help_text="This many nodes that lack the weights.")


class PrefetchAnswerSerializer(s.Serializer):
    model = s.CharField()
    prefetch = PrefetchSerializer(many=True)
    note = s.CharField()


class AdapterSerializer(s.Serializer):
    name = s.CharField(help_text="A model name clients ask for; served by this model's replicas.")
    source = s.CharField(help_text="Where the adapter's weights come from.")


class ModelSerializer(s.Serializer):
    name = s.CharField()
    source = s.CharField(allow_blank=True)
    min_replicas = s.IntegerField()
    max_replicas = s.IntegerField()
    on_demand = s.BooleanField(help_text="Minimum 0: started when a request asks for it.")
    declared_in = s.ChoiceField(choices=["store", "file"], help_text="file: read-only here.")
    read_only = s.BooleanField()
    ready_replicas = s.IntegerField()
    total_replicas = s.IntegerField(help_text="Pending, starting and ready.")
    aliases = s.ListField(child=s.CharField())
    fallbacks = s.ListField(child=s.CharField())
    adapters = AdapterSerializer(many=True, help_text="LoRA adapters on this model, each a model name of its own.")
    profiles = s.ListField(child=s.CharField(), help_text="The profiles' names, in order (the seeds' type).")
    profile_specs = ProfileSerializer(many=True, help_text="The same profiles in full: engine, class, GPUs, nodes.")
    parked = s.BooleanField(help_text="Its replicas failed at every start; nothing is placed until an operator acts.")
    unplaceable = s.BooleanField(help_text="The scheduler's last word: it cannot place what the model wants.")
    description = s.CharField(required=False)
    idle_timeout_seconds = s.IntegerField(required=False, help_text="Absent: never scaled down for idleness.")
    parked_at = s.DateTimeField(required=False)
    parked_error = s.CharField(required=False, allow_blank=True)
    failures = s.IntegerField(required=False)
    desired_replicas = s.IntegerField(help_text="Replicas wanted now: the autoscaler's count, else the minimum.")
    prefetch = PrefetchSerializer(many=True, required=False, help_text="Its weights asked for on nodes, with progress.")
    autoscale = AutoscaleSerializer(
        required=False, help_text="The autoscaler's latest decision; absent when max = min or not yet decided."
    )


class ScaleRequestSerializer(s.Serializer):
    min = s.IntegerField(min_value=0)
    max = s.IntegerField(min_value=0, required=False, help_text="Omitted: follows min (or keeps a larger max).")
    idle_timeout = s.CharField(
        required=False,
        allow_null=True,
        help_text="Like 30m, 1h30m or 90s (or a number of seconds); null: never; omitted: unchanged.",
    )


class ScaleSerializer(s.Serializer):
    """The scaling now in force, which may differ from what was asked (a max filled in)."""

    model = s.CharField()
    min = s.IntegerField()
    max = s.IntegerField()
    on_demand = s.BooleanField()
    idle_timeout_seconds = s.IntegerField(required=False, help_text="Absent: never.")


class RemovedSerializer(s.Serializer):
    removed = s.CharField()


class CapacityRequestSerializer(s.Serializer):
    profile = s.CharField(help_text="The profile the measurement was taken on.")
    measured_at = s.DateTimeField(required=False, help_text="Default: now.")


class CapacitySerializer(s.Serializer):
    model = s.CharField()
    profile = s.CharField()
    measured_at = s.DateTimeField()
    measurement = s.DictField(child=s.JSONField(), help_text="The benchmark's figures, as it sent them.")
    measured_by = s.CharField(required=False)
